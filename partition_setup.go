package pgdedup

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Setup makes the dedup table the shape [Config.Layout] asks for. With
// [Plain] it does nothing ([Migrate] makes the plain table). With
// [Partitioned] it replaces the empty plain table that Migrate made by a
// table partitioned by claim time (same name, same columns, same privileges,
// plus SELECT on pgdedup_partitions for every role that may insert), records
// its partition span (Retention ÷ [Config.Partitions]) in pgdedup_partitions,
// and creates the partitions for the next spans, and one for the past
// Retention (for IDs imported with their times: see docs/partitioning.md). Run it once
// after Migrate,
// as the table's owner: it is idempotent, and on
// a table already partitioned it only creates missing partitions.
//
// A plain table that holds rows is moved online while consumers claim: it
// becomes the partition of all claim times before a switch time T, at least
// 10 minutes and one partition span ahead, logged ([Config.Logger]) and
// shown by [Store.Stats] as that partition's end. A claim waits for the move
// at most one lock attempt of 200 ms and the short transaction that follows. A row at or after T, or a lock not
// taken by 5 minutes before T, leaves the table as it was, with an error.
// Stores look a plain table up again every minute and so follow the move;
// a process running an older pgdedup release claims exactly only until T,
// and must be stopped by then. [SetupMigration] runs Setup from goose.
//
// On a table Citus distributes it returns an error: the
// Partitioned layout is plain PostgreSQL only.
//
// A role granted INSERT on the table later also needs SELECT on
// pgdedup_partitions, which every claim reads.
//
// After Setup, [Store.Cleanup] (RunCleaner, `pgdedup cleanup`) keeps the
// partitions: it creates them ahead of need, seals them and drops those whose
// IDs have all expired. Run it at least every partition span.
func (s *Store) Setup(ctx context.Context) error {
	if s.cfg.Layout != Partitioned {
		return nil
	}
	var citus, distributed bool
	if err := s.db.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`).Scan(&citus); err != nil {
		return fmt.Errorf("pgdedup: setup %s: %w", s.messages.table, withDetail(err))
	}
	if citus {
		err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1))`,
			s.messages.table).Scan(&distributed)
		if err != nil {
			return fmt.Errorf("pgdedup: setup %s: %w", s.messages.table, withDetail(err))
		}
		if distributed {
			return fmt.Errorf("pgdedup: setup %s: the table is distributed by Citus, and the Partitioned layout runs on plain PostgreSQL only", s.messages.table)
		}
	}
	span := s.cfg.Retention / time.Duration(s.cfg.Partitions)
	if populated, err := s.populatedPlain(ctx); err != nil {
		return err
	} else if populated {
		// Moved online, without the lock below, which claims would queue
		// behind; the old table covers the past.
		if _, err := s.movePopulated(ctx, span); err != nil {
			return err
		}
		s.found.Store(nil)
		_, err := s.createPartitions(ctx, 0)
		return err
	}
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`SELECT pg_catalog.set_config('lock_timeout', '5s', true)`)
	b.Queue(`CREATE TABLE IF NOT EXISTS ` + s.partitionMeta + ` (
    parent regclass    PRIMARY KEY,
    span   interval    NOT NULL,
    sealed timestamptz NOT NULL
)`)
	b.Queue(s.setupSQL(span))
	b.Queue(`COMMIT`)
	if err := s.db.SendBatch(ctx, b).Close(); err != nil {
		if code, _ := sqlState(err); code != "PGD01" {
			return fmt.Errorf("pgdedup: setup %s: %w", s.messages.table, withDetail(err))
		}
		// Rows came in since populatedPlain looked: moved online.
		if _, err := s.movePopulated(ctx, span); err != nil {
			return err
		}
	}
	s.found.Store(nil) // look the layout up again
	// Partitions for the past Retention too, for IDs imported with their
	// original times (sealed already: no claim chooses them).
	if _, err := s.createPartitions(ctx, s.cfg.Retention); err != nil {
		return err
	}
	return nil
}

// setupSQL is the DO block that replaces the empty plain table by the
// partitioned one, in the transaction Setup opens, with the plain table
// locked (ACCESS EXCLUSIVE, waiting at most lock_timeout) while it checks
// that it is empty. The privileges granted on the plain table are granted
// again on the new one; whoever may insert also gets SELECT on
// pgdedup_partitions, which every claim reads. Built-ins are named with
// their schema; the trigger is 00003's, which fills key for raw-SQL inserts.
func (s *Store) setupSQL(span time.Duration) string {
	t, meta := s.messages.table, s.partitionMeta
	spanSQL := fmt.Sprintf(`'%d microseconds'::pg_catalog.interval`, span.Microseconds())
	return `DO $pgdedup$
DECLARE
    t   pg_catalog.regclass := pg_catalog.to_regclass('` + t + `');
    acl pg_catalog.aclitem[];
    nsp pg_catalog.name;
    rel pg_catalog.name;
    g   record;
BEGIN
    IF t IS NULL THEN
        RAISE EXCEPTION 'table ` + t + ` not found: run pgdedup.Migrate first';
    END IF;
    IF (SELECT relkind FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) t::pg_catalog.oid) OPERATOR(pg_catalog.<>) 'p' THEN
        LOCK TABLE ` + t + ` IN ACCESS EXCLUSIVE MODE;
        IF EXISTS (SELECT FROM ` + t + `) THEN
            RAISE EXCEPTION USING ERRCODE = 'PGD01', MESSAGE = 'table ` + t + ` holds rows';
        END IF;
        SELECT c.relacl, n.nspname, c.relname INTO acl, nsp, rel
        FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
        WHERE c.oid OPERATOR(pg_catalog.=) t::pg_catalog.oid;
        -- The same columns (00002's included) and defaults, partitioned.
        EXECUTE pg_catalog.format('CREATE TABLE %I.pgdedup_partitioned_new (LIKE %I.%I INCLUDING DEFAULTS) PARTITION BY RANGE (processed_at)',
            nsp, nsp, rel);
        EXECUTE pg_catalog.format('DROP TABLE %I.%I', nsp, rel);
        EXECUTE pg_catalog.format('ALTER TABLE %I.pgdedup_partitioned_new RENAME TO %I', nsp, rel);
        -- 00003's trigger, which fills key for raw-SQL inserts, from the
        -- table's schema, where Migrate put it.
        EXECUTE pg_catalog.format('CREATE TRIGGER processed_messages_fill_key BEFORE INSERT ON %I.%I
            FOR EACH ROW WHEN (NEW.key IS NULL) EXECUTE FUNCTION %I.pgdedup_fill_key()', nsp, rel, nsp);
        t := pg_catalog.to_regclass('` + t + `');
        FOR g IN SELECT a.privilege_type, a.grantee, a.is_grantable FROM pg_catalog.aclexplode(acl) a
                 WHERE a.grantee OPERATOR(pg_catalog.<>) a.grantor LOOP
            EXECUTE pg_catalog.format('GRANT %s ON ` + t + ` TO %s%s', g.privilege_type,
                CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                     ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)::pg_catalog.text) END,
                CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
            IF g.privilege_type OPERATOR(pg_catalog.=) 'INSERT' THEN
                EXECUTE pg_catalog.format('GRANT SELECT ON ` + meta + ` TO %s',
                    CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                         ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)::pg_catalog.text) END);
            END IF;
        END LOOP;
    END IF;
    DELETE FROM ` + meta + ` m WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) m.parent::pg_catalog.oid);
    INSERT INTO ` + meta + ` (parent, span, sealed)
    VALUES (t, ` + spanSQL + `, pg_catalog.date_bin(` + spanSQL + `, pg_catalog.clock_timestamp(), ` + partitionOrigin + `))
    ON CONFLICT (parent) DO NOTHING;
END
$pgdedup$`
}
