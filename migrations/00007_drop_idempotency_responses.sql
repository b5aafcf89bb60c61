-- pgdedup: drop the columns of migration 00002.
--
-- Before migration 00006 the idempotency middleware kept each answer in four
-- columns of its own, request_fingerprint, response_status, response_headers
-- and response_body. Since 00006 it keeps them in fingerprint and result, like
-- any stored result. This release no longer reads the old columns, so they go.
--
-- An unexpired answer in the old columns would be lost with them. So the
-- migration refuses, and changes nothing, while a row holds one. Its error
-- says how many there are and when the last one expires. That is one
-- Retention after the last service stopped running a release before 00006.
-- The rollout order is in docs/operations.md.
--
-- Each step below is its own transaction and can be run again.
--
--   1. Refuse while a row holds an unexpired answer in the old columns. This
--      is a scan that blocks no claim.
--   2. Add a NOT VALID check that the old columns are NULL, under one short
--      lock. From then on no writer can fill them. A release before 00006
--      fails loudly instead of storing an answer that would be dropped.
--   3. Look again, for answers written between steps 1 and 2. If there is
--      one, drop the check and refuse as in step 1.
--   4. Drop the columns, under one more short lock. The check goes with them.
--
-- Each short lock gives up after 200 ms and is tried again, as in 00003 and
-- 00006, so claims never queue behind a long transaction. On a partitioned
-- table the check and the drop reach every partition. On Citus they reach
-- every shard.

-- +goose NO TRANSACTION
-- +goose Up
-- +goose StatementBegin
-- Step 1. The condition is built from the old columns that are there, so a
-- run interrupted after step 4 finds nothing to do.
DO $$
DECLARE
    cols text;
    n    bigint;
    last timestamptz;
BEGIN
    SELECT pg_catalog.string_agg(pg_catalog.format('%I IS NOT NULL', attname), ' OR ') INTO cols
    FROM pg_catalog.pg_attribute
    WHERE attrelid OPERATOR(pg_catalog.=) 'processed_messages'::pg_catalog.regclass::pg_catalog.oid
      AND attnum OPERATOR(pg_catalog.>) 0 AND NOT attisdropped
      AND attname OPERATOR(pg_catalog.=) ANY (ARRAY['request_fingerprint', 'response_status', 'response_headers', 'response_body']::pg_catalog.name[]);
    IF cols IS NULL THEN
        RETURN;
    END IF;
    EXECUTE 'SELECT pg_catalog.count(*), pg_catalog.max(expires_at) FROM processed_messages'
         OPERATOR(pg_catalog.||) ' WHERE expires_at OPERATOR(pg_catalog.>) pg_catalog.now() AND (' OPERATOR(pg_catalog.||) cols OPERATOR(pg_catalog.||) ')'
        INTO n, last;
    IF n OPERATOR(pg_catalog.>) 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'PGD06', MESSAGE = pg_catalog.format(
            'processed_messages holds %s unexpired answers in the columns of migration 00002, the last expiring at %s: '
            'an idempotency middleware from before migration 00006 stored them, and this pgdedup no longer reads them. '
            'Nothing was changed. Keep every service on a release that reads them (one with migration 00006 and without 00007), '
            'and run this migration again after that time (docs/operations.md)',
            n, pg_catalog.to_char(last AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'));
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Step 2. Only the table's owner can add a constraint to it, so a check of
-- that name that is there already is this migration's, from a run that was
-- interrupted.
DO $$
DECLARE
    cols text;
BEGIN
    SELECT pg_catalog.string_agg(pg_catalog.format('%I IS NULL', attname), ' AND ') INTO cols
    FROM pg_catalog.pg_attribute
    WHERE attrelid OPERATOR(pg_catalog.=) 'processed_messages'::pg_catalog.regclass::pg_catalog.oid
      AND attnum OPERATOR(pg_catalog.>) 0 AND NOT attisdropped
      AND attname OPERATOR(pg_catalog.=) ANY (ARRAY['request_fingerprint', 'response_status', 'response_headers', 'response_body']::pg_catalog.name[]);
    IF cols IS NULL OR EXISTS (SELECT FROM pg_catalog.pg_constraint
                               WHERE conrelid OPERATOR(pg_catalog.=) 'processed_messages'::pg_catalog.regclass::pg_catalog.oid
                                 AND conname OPERATOR(pg_catalog.=) 'processed_messages_00002_unused') THEN
        RETURN;
    END IF;
    PERFORM pg_catalog.set_config('lock_timeout', '200ms', true);
    LOOP
        BEGIN
            EXECUTE 'ALTER TABLE processed_messages ADD CONSTRAINT processed_messages_00002_unused CHECK ('
                OPERATOR(pg_catalog.||) cols OPERATOR(pg_catalog.||) ') NOT VALID';
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_catalog.pg_sleep(0.05::pg_catalog.float8 + pg_catalog.random() * 0.2::pg_catalog.float8);
        END;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Step 3. Every transaction that wrote before the check was added has ended,
-- since adding it waited for them. So this scan sees all the answers there
-- will ever be in the old columns. On a refusal the check is dropped and that
-- is committed before the error, so nothing is left changed.
DO $$
DECLARE
    cols text;
    n    bigint;
    last timestamptz;
BEGIN
    SELECT pg_catalog.string_agg(pg_catalog.format('%I IS NOT NULL', attname), ' OR ') INTO cols
    FROM pg_catalog.pg_attribute
    WHERE attrelid OPERATOR(pg_catalog.=) 'processed_messages'::pg_catalog.regclass::pg_catalog.oid
      AND attnum OPERATOR(pg_catalog.>) 0 AND NOT attisdropped
      AND attname OPERATOR(pg_catalog.=) ANY (ARRAY['request_fingerprint', 'response_status', 'response_headers', 'response_body']::pg_catalog.name[]);
    IF cols IS NULL THEN
        RETURN;
    END IF;
    EXECUTE 'SELECT pg_catalog.count(*), pg_catalog.max(expires_at) FROM processed_messages'
         OPERATOR(pg_catalog.||) ' WHERE expires_at OPERATOR(pg_catalog.>) pg_catalog.now() AND (' OPERATOR(pg_catalog.||) cols OPERATOR(pg_catalog.||) ')'
        INTO n, last;
    IF n OPERATOR(pg_catalog.=) 0 THEN
        RETURN;
    END IF;
    PERFORM pg_catalog.set_config('lock_timeout', '200ms', true);
    LOOP
        BEGIN
            ALTER TABLE processed_messages DROP CONSTRAINT IF EXISTS processed_messages_00002_unused;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_catalog.pg_sleep(0.05::pg_catalog.float8 + pg_catalog.random() * 0.2::pg_catalog.float8);
        END;
    END LOOP;
    COMMIT;
    RAISE EXCEPTION USING ERRCODE = 'PGD06', MESSAGE = pg_catalog.format(
        'processed_messages holds %s unexpired answers in the columns of migration 00002, the last expiring at %s: '
        'an idempotency middleware from before migration 00006 stored them while this migration ran, and this pgdedup no longer reads them. '
        'Nothing was changed. Stop the releases from before 00006, keep every service on a release that reads them (one with migration 00006 and without 00007), '
        'and run this migration again after that time (docs/operations.md)',
        n, pg_catalog.to_char(last AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'));
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Step 4.
DO $$
BEGIN
    PERFORM pg_catalog.set_config('lock_timeout', '200ms', true);
    LOOP
        BEGIN
            ALTER TABLE processed_messages
                DROP COLUMN IF EXISTS request_fingerprint,
                DROP COLUMN IF EXISTS response_status,
                DROP COLUMN IF EXISTS response_headers,
                DROP COLUMN IF EXISTS response_body;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_catalog.pg_sleep(0.05::pg_catalog.float8 + pg_catalog.random() * 0.2::pg_catalog.float8);
        END;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The columns come back empty, and the answers they held are gone. A release
-- from before this migration reads them again and finds no answer there,
-- which it treats like a row without one. Adding them changes only the
-- catalog, as in 00002, under a short lock that is tried again like those
-- above.

-- +goose StatementBegin
DO $$
BEGIN
    PERFORM pg_catalog.set_config('lock_timeout', '200ms', true);
    LOOP
        BEGIN
            ALTER TABLE processed_messages
                ADD COLUMN IF NOT EXISTS request_fingerprint bytea,
                ADD COLUMN IF NOT EXISTS response_status integer,
                ADD COLUMN IF NOT EXISTS response_headers jsonb,
                ADD COLUMN IF NOT EXISTS response_body bytea;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_catalog.pg_sleep(0.05::pg_catalog.float8 + pg_catalog.random() * 0.2::pg_catalog.float8);
        END;
    END LOOP;
END
$$;
-- +goose StatementEnd
