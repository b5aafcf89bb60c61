-- pgdedup: a payload fingerprint and a stored result per message ID.
--
-- fingerprint is what pgdedup.WithFingerprint passes to a claim (the SHA-256
-- of the payload, say): a duplicate whose fingerprint differs from the stored
-- one is reported as ErrPayloadMismatch instead of being skipped silently.
-- result is what the fn of Store.ProcessResult returned, stored in the claim's
-- transaction and returned to every duplicate. Claims that use neither leave
-- both NULL and send the same statement as before this migration.
--
-- Online: the columns are nullable without a default, so adding them only
-- changes the catalog (no table rewrite, instant on a populated table). The
-- ALTER still needs a brief exclusive lock; it gives up after 200 ms and tries
-- again rather than queue every claim behind a long transaction, as 00003 does.

-- +goose Up
-- +goose StatementBegin
DO $$
BEGIN
    PERFORM pg_catalog.set_config('lock_timeout', '200ms', true);
    LOOP
        BEGIN
            ALTER TABLE processed_messages
                ADD COLUMN IF NOT EXISTS fingerprint bytea,
                ADD COLUMN IF NOT EXISTS result bytea;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_catalog.pg_sleep(0.05::pg_catalog.float8 + pg_catalog.random() * 0.2::pg_catalog.float8);
        END;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
ALTER TABLE processed_messages
    DROP COLUMN fingerprint,
    DROP COLUMN result;
