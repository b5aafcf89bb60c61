-- pgdedup: columns for the HTTP Idempotency-Key middleware (package idempotency),
-- which keeps a key's request fingerprint and its response in the key's row, so
-- keys expire and are cleaned up exactly like message IDs.
--
-- The columns are nullable and have no default, so adding them only changes the
-- catalog: no table rewrite, instant on a populated table (the ALTER still needs
-- a brief exclusive lock, so it waits for transactions using the table to end).
-- Rows of message consumers keep NULLs and are otherwise unchanged.

-- +goose Up
ALTER TABLE processed_messages
    ADD COLUMN request_fingerprint bytea,   -- SHA-256 of the request's method, target and body
    ADD COLUMN response_status     integer, -- NULL: not an HTTP key
    ADD COLUMN response_headers    jsonb,   -- the headers chosen for replay
    ADD COLUMN response_body       bytea;   -- NULL with a status: too large to keep

-- +goose Down
ALTER TABLE processed_messages
    DROP COLUMN request_fingerprint,
    DROP COLUMN response_status,
    DROP COLUMN response_headers,
    DROP COLUMN response_body;
