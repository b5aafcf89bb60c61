-- pgdedup: message IDs claimed in the same transaction as the business write.
-- The primary key is the dedup check; expires_at drives cleanup.

-- +goose Up
CREATE TABLE processed_messages (
    consumer     text        NOT NULL,
    message_id   text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (consumer, message_id)
);

-- Cleanup deletes by expires_at in bounded batches; this index keeps each batch cheap.
CREATE INDEX processed_messages_expires_at_idx ON processed_messages (expires_at);

-- +goose Down
DROP TABLE processed_messages;
