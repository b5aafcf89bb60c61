-- pgdedup: the last processed offset of each (consumer, topic, partition) of a
-- partitioned log (Kafka), updated in the same transaction as the business
-- write. For a log that a consumer reads in order, one row per partition gives
-- the same exactly-once guarantee as one row per message, with constant state
-- and nothing to clean up.
--
-- A claim only moves last_offset forward (and generation never backward); it
-- keeps the value it replaced in prev_offset, so a batch claim can tell in one
-- statement which of its offsets were new. This migration is independent of
-- processed_messages: it creates a table of its own.

-- +goose Up
CREATE TABLE processed_offsets (
    consumer    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    last_offset bigint      NOT NULL,  -- highest offset whose effects committed
    prev_offset bigint,                -- last_offset before the latest claim; NULL after the first
    generation  bigint      NOT NULL DEFAULT 0, -- fencing token of the latest claimer
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition)
) WITH (fillfactor = 50); -- each claim updates its partition's row: room on the page keeps updates HOT

-- +goose Down
DROP TABLE processed_offsets;
