-- pgdedup: a compact primary key for big tables.
--
-- The primary key becomes key uuid, the first 16 bytes of
-- SHA-256(consumer || 0x00 || message_id): 16 bytes an entry instead of the
-- consumer and the whole ID, so the index that every claim writes to is about
-- half the size, and each checkpoint cycle dirties fewer of its pages (fewer
-- full-page images in the WAL). consumer and message_id stay as plain columns.
-- Sizing: docs/operations.md.
--
-- The migration upgrades a populated table in place, while services (old or
-- new code) keep claiming: nothing below holds a lock that blocks claims for
-- more than one short catalog change, and each of those gives up after 200 ms
-- and retries rather than queue claims behind a long transaction. Each step is
-- idempotent, so a migration interrupted anywhere can be run again.
--
--   1. pgdedup_key(consumer, message_id), the key as SQL computes it (the same
--      as pgdedup.Key in Go), for operators, raw SQL and triggers.
--   2. One short lock: the nullable column key (a catalog change, no rewrite),
--      a NOT VALID check that it is set, and an insert trigger that fills it
--      when an insert leaves it NULL (code that predates this migration, raw
--      SQL). The trigger stays: its WHEN clause costs nothing when key is given.
--   3. Backfill of the existing rows, 2,000 per transaction, in the order of the
--      old primary key; a redelivered old ID waits at most for one batch.
--   4. VALIDATE the check (a scan that blocks no writes), and build the unique
--      index on key CONCURRENTLY.
--   5. One short lock: the index becomes the primary key in place of
--      (consumer, message_id), whose index is dropped; the check is dropped.
--
-- Uniqueness is exact throughout: key is a function of (consumer, message_id),
-- and one of the two unique indexes is the primary key at every instant.

-- +goose NO TRANSACTION
-- +goose Up
-- +goose StatementBegin
-- pgdedup never uses an object it did not create (docs/operations.md, threat
-- model): a role with CREATE on this schema could have made these functions
-- first, and CREATE OR REPLACE run by a superuser would keep that role as
-- their owner. Refused unless the table's owner, the migrating role or a
-- superuser owns them, before and after they are made.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT n.nspname, p.proname, pg_catalog.pg_get_userbyid(p.proowner) AS owner
             FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
             WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()
             AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['pgdedup_key', 'pgdedup_fill_key']::pg_catalog.name[])
             AND p.proowner OPERATOR(pg_catalog.<>) (SELECT relowner FROM pg_catalog.pg_class
                 WHERE oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('processed_messages'::pg_catalog.text)::pg_catalog.oid)
             AND p.proowner OPERATOR(pg_catalog.<>) (SELECT oid FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) CURRENT_USER)
             AND NOT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE oid OPERATOR(pg_catalog.=) p.proowner) LOOP
        RAISE EXCEPTION USING ERRCODE = 'PGD05', MESSAGE = pg_catalog.format(
            'function %I.%I exists, owned by role %I, which does not own processed_messages: pgdedup never uses an object it did not create; drop it once you know who made it and why (docs/operations.md, threat model)',
            r.nspname, r.proname, r.owner);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgdedup_key(consumer text, message_id text) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT pg_catalog.encode(pg_catalog.substring(pg_catalog.sha256(
    pg_catalog.convert_to(consumer, 'UTF8'::pg_catalog.name)
    OPERATOR(pg_catalog.||) pg_catalog.decode('00'::pg_catalog.text, 'hex'::pg_catalog.text)
    OPERATOR(pg_catalog.||) pg_catalog.convert_to(message_id, 'UTF8'::pg_catalog.name)), 1, 16), 'hex'::pg_catalog.text)::pg_catalog.uuid
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- The trigger function does not call pgdedup_key: the search_path of the
-- session that inserts may not include this schema. Both functions fix their
-- own search_path and name every built-in with its schema and exact argument
-- types: otherwise a function or operator that a role planted in a schema on
-- the caller's search_path (convert_to(text, text) wins over the built-in
-- convert_to(text, name)) would run with the caller's privileges, the
-- migrating owner's during the backfill.
CREATE OR REPLACE FUNCTION pgdedup_fill_key() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    NEW.key := pg_catalog.encode(pg_catalog.substring(pg_catalog.sha256(
        pg_catalog.convert_to(NEW.consumer, 'UTF8'::pg_catalog.name)
        OPERATOR(pg_catalog.||) pg_catalog.decode('00'::pg_catalog.text, 'hex'::pg_catalog.text)
        OPERATOR(pg_catalog.||) pg_catalog.convert_to(NEW.message_id, 'UTF8'::pg_catalog.name)), 1, 16), 'hex'::pg_catalog.text)::pg_catalog.uuid;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- pgdedup never uses an object it did not create (docs/operations.md, threat
-- model): a role with CREATE on this schema could have made these functions
-- first, and CREATE OR REPLACE run by a superuser would keep that role as
-- their owner. Refused unless the table's owner, the migrating role or a
-- superuser owns them, before and after they are made.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT n.nspname, p.proname, pg_catalog.pg_get_userbyid(p.proowner) AS owner
             FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
             WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()
             AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['pgdedup_key', 'pgdedup_fill_key']::pg_catalog.name[])
             AND p.proowner OPERATOR(pg_catalog.<>) (SELECT relowner FROM pg_catalog.pg_class
                 WHERE oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('processed_messages'::pg_catalog.text)::pg_catalog.oid)
             AND p.proowner OPERATOR(pg_catalog.<>) (SELECT oid FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) CURRENT_USER)
             AND NOT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE oid OPERATOR(pg_catalog.=) p.proowner) LOOP
        RAISE EXCEPTION USING ERRCODE = 'PGD05', MESSAGE = pg_catalog.format(
            'function %I.%I exists, owned by role %I, which does not own processed_messages: pgdedup never uses an object it did not create; drop it once you know who made it and why (docs/operations.md, threat model)',
            r.nspname, r.proname, r.owner);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
BEGIN
    PERFORM pg_catalog.set_config('lock_timeout', '200ms', true);
    LOOP
        BEGIN
            ALTER TABLE processed_messages ADD COLUMN IF NOT EXISTS key uuid;
            IF NOT EXISTS (SELECT FROM pg_constraint WHERE conrelid = 'processed_messages'::pg_catalog.regclass::pg_catalog.oid
                           AND (conname = 'processed_messages_key_not_null' OR pg_get_constraintdef(oid) = 'PRIMARY KEY (key)')) THEN
                ALTER TABLE processed_messages ADD CONSTRAINT processed_messages_key_not_null CHECK (key IS NOT NULL) NOT VALID;
            END IF;
            IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = 'processed_messages'::pg_catalog.regclass::pg_catalog.oid AND tgname = 'processed_messages_fill_key') THEN
                CREATE TRIGGER processed_messages_fill_key BEFORE INSERT ON processed_messages
                    FOR EACH ROW WHEN (NEW.key IS NULL) EXECUTE FUNCTION pgdedup_fill_key();
            END IF;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_catalog.pg_sleep(0.05::pg_catalog.float8 + pg_catalog.random() * 0.2::pg_catalog.float8);
        END;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Backfill in pages of 2,000 rows in the old primary key's order (an index
-- range scan on any PostgreSQL), each page its own transaction. Rows inserted
-- since the trigger exists already have their key.
DO $$
DECLARE
    lo_consumer text;
    lo_id       text;
    hi_consumer text;
    hi_id       text;
BEGIN
    IF (SELECT pg_get_constraintdef(oid) FROM pg_constraint
        WHERE conrelid = 'processed_messages'::pg_catalog.regclass::pg_catalog.oid AND contype = 'p') <> 'PRIMARY KEY (consumer, message_id)' THEN
        RETURN; -- the primary key is key already: nothing left to fill
    END IF;
    SELECT consumer, message_id INTO lo_consumer, lo_id FROM processed_messages ORDER BY consumer, message_id LIMIT 1;
    WHILE lo_consumer IS NOT NULL LOOP
        SELECT consumer, message_id INTO hi_consumer, hi_id FROM (
            SELECT consumer, message_id FROM processed_messages
            WHERE (consumer, message_id) >= (lo_consumer, lo_id)
            ORDER BY consumer, message_id LIMIT 2000) AS page
        ORDER BY consumer DESC, message_id DESC LIMIT 1;
        UPDATE processed_messages SET key = pgdedup_key(consumer, message_id)
        WHERE (consumer, message_id) >= (lo_consumer, lo_id) AND (consumer, message_id) <= (hi_consumer, hi_id)
          AND key IS NULL;
        COMMIT;
        lo_consumer := NULL;
        SELECT consumer, message_id INTO lo_consumer, lo_id FROM processed_messages
        WHERE (consumer, message_id) > (hi_consumer, hi_id) ORDER BY consumer, message_id LIMIT 1;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- A scan that takes no lock against writes; afterwards the primary key can be
-- added without scanning the table under its exclusive lock.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_constraint WHERE conrelid = 'processed_messages'::pg_catalog.regclass::pg_catalog.oid
               AND conname = 'processed_messages_key_not_null' AND NOT convalidated) THEN
        ALTER TABLE processed_messages VALIDATE CONSTRAINT processed_messages_key_not_null;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- A CREATE INDEX CONCURRENTLY interrupted by a failure leaves an invalid index
-- behind; drop it so that the next statement builds it again.
DO $$
BEGIN
    PERFORM pg_catalog.set_config('lock_timeout', '200ms', true);
    LOOP
        BEGIN
            IF EXISTS (SELECT FROM pg_index WHERE indexrelid = pg_catalog.to_regclass('processed_messages_key_new'::pg_catalog.text)::pg_catalog.oid AND NOT indisvalid) THEN
                DROP INDEX processed_messages_key_new;
            END IF;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_catalog.pg_sleep(0.05::pg_catalog.float8 + pg_catalog.random() * 0.2::pg_catalog.float8);
        END;
    END LOOP;
END
$$;
-- +goose StatementEnd

CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS processed_messages_key_new ON processed_messages (key);

-- +goose StatementBegin
-- The swap: one short exclusive lock, no scan (the validated check proves key
-- is never NULL). If this migration is run again after the swap, the index just
-- built again is redundant and is dropped here instead.
DO $$
BEGIN
    PERFORM pg_catalog.set_config('lock_timeout', '200ms', true);
    LOOP
        BEGIN
            IF (SELECT pg_get_constraintdef(oid) FROM pg_constraint
                WHERE conrelid = 'processed_messages'::pg_catalog.regclass::pg_catalog.oid AND contype = 'p') = 'PRIMARY KEY (consumer, message_id)' THEN
                ALTER TABLE processed_messages
                    DROP CONSTRAINT processed_messages_pkey,
                    ADD CONSTRAINT processed_messages_pkey PRIMARY KEY USING INDEX processed_messages_key_new,
                    DROP CONSTRAINT processed_messages_key_not_null;
            ELSIF pg_catalog.to_regclass('processed_messages_key_new'::pg_catalog.text) IS NOT NULL THEN
                DROP INDEX processed_messages_key_new;
            END IF;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_catalog.pg_sleep(0.05::pg_catalog.float8 + pg_catalog.random() * 0.2::pg_catalog.float8);
        END;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The reverse, just as online: the unique index on (consumer, message_id) is
-- built concurrently, then becomes the primary key again in one short lock,
-- and key, its trigger and functions are dropped. Code that writes key must be
-- gone before this runs.

-- +goose StatementBegin
DO $$
BEGIN
    PERFORM pg_catalog.set_config('lock_timeout', '200ms', true);
    LOOP
        BEGIN
            IF EXISTS (SELECT FROM pg_index WHERE indexrelid = pg_catalog.to_regclass('processed_messages_id_new'::pg_catalog.text)::pg_catalog.oid AND NOT indisvalid) THEN
                DROP INDEX processed_messages_id_new;
            END IF;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_catalog.pg_sleep(0.05::pg_catalog.float8 + pg_catalog.random() * 0.2::pg_catalog.float8);
        END;
    END LOOP;
END
$$;
-- +goose StatementEnd

CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS processed_messages_id_new ON processed_messages (consumer, message_id);

-- +goose StatementBegin
DO $$
BEGIN
    PERFORM pg_catalog.set_config('lock_timeout', '200ms', true);
    LOOP
        BEGIN
            IF (SELECT pg_get_constraintdef(oid) FROM pg_constraint
                WHERE conrelid = 'processed_messages'::pg_catalog.regclass::pg_catalog.oid AND contype = 'p') = 'PRIMARY KEY (key)' THEN
                ALTER TABLE processed_messages
                    DROP CONSTRAINT processed_messages_pkey,
                    ADD CONSTRAINT processed_messages_pkey PRIMARY KEY USING INDEX processed_messages_id_new;
            ELSIF pg_catalog.to_regclass('processed_messages_id_new'::pg_catalog.text) IS NOT NULL THEN
                DROP INDEX processed_messages_id_new;
            END IF;
            DROP TRIGGER IF EXISTS processed_messages_fill_key ON processed_messages;
            ALTER TABLE processed_messages DROP COLUMN IF EXISTS key;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_catalog.pg_sleep(0.05::pg_catalog.float8 + pg_catalog.random() * 0.2::pg_catalog.float8);
        END;
    END LOOP;
END
$$;
-- +goose StatementEnd

DROP FUNCTION IF EXISTS pgdedup_fill_key();
DROP FUNCTION IF EXISTS pgdedup_key(text, text);
