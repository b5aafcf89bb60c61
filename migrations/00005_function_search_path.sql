-- pgdedup: the functions of migration 00003 run with a fixed search_path.
--
-- As first released, pgdedup_key() and the trigger function pgdedup_fill_key()
-- resolved the built-ins they call through the caller's search_path. A role
-- allowed to create objects in a schema on that path (public, before
-- PostgreSQL 15, for every role) could plant convert_to(text, text), which wins
-- over the built-in convert_to(text, name), and have it run with the
-- privileges of whoever inserted a row without key, or of the owner running the
-- 00003 backfill. Migration 00003 now creates them as below; this migration
-- replaces them in databases that applied the old 00003. Every function and
-- trigger pgdedup creates follows the same rule: SET search_path =
-- pg_catalog, pg_temp, and built-ins named with their schema and exact
-- argument types.

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

-- +goose Down
-- Nothing to revert: the functions stay safe. Migration 00003's Down drops them.
