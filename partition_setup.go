package pgdedup

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Setup makes the dedup table the shape [Config.Layout] asks for. With
// [LayoutPlain] it does nothing ([Migrate] makes the plain table). With
// [LayoutPartitioned] it replaces the empty plain table that Migrate made by a
// table partitioned by claim time (same name, same columns, same privileges,
// column grants, row-level security and policies, plus SELECT on
// pgdedup_partitions for every role that may insert; a trigger of the
// user's own is refused with an error naming it), records
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
// at most one lock attempt of 200 ms and the short transaction that follows. A row whose
// processed_at is at or after T (or before 2000), which only a raw INSERT
// or an import makes, is given the move's time first (its ID stays
// claimed). A lock not taken by 5 minutes before T leaves the table as it
// was, with an error.
// Stores look a plain table up again every minute and so follow the move;
// a process running an older pgdedup release claims exactly only until T,
// and must be stopped by then. [SetupMigration] runs Setup from goose.
//
// On a table Citus distributes, Setup replaces the empty table by a
// partitioned one distributed by the same column, in the same shard group
// (co-located with the business tables that were), and creates the function
// claims call there (pgdedup_partitioned_claim, in the table's schema): see
// docs/partitioning.md. A populated distributed table is refused: the move
// runs on plain PostgreSQL only.
//
// A role granted INSERT on the table later also needs SELECT on
// pgdedup_partitions, which every claim reads.
//
// Setup uses no object it did not create in the same transaction. An
// existing pgdedup_partitions, partition or claim function is used only if
// its owner is the table's owner, the role running Setup or a superuser
// (and pgdedup_partitions has no triggers, rules or row security, and a
// partition a valid unique index on key). Any other object under a name
// Setup creates makes it fail with an error naming the object and its owner.
//
// After Setup, [Store.Cleanup] (RunCleaner, `pgdedup cleanup`) keeps the
// partitions: it creates them ahead of need, seals them and drops those whose
// IDs have all expired. Run it at least every partition span.
func (s *Store) Setup(ctx context.Context) error {
	if s.cfg.Layout != LayoutPartitioned {
		return nil
	}
	span := s.cfg.Retention / time.Duration(s.cfg.Partitions)
	wasDistributed, err := s.distributed(ctx)
	if err != nil {
		return err
	}
	populated, err := s.populatedPlain(ctx)
	switch {
	case err != nil:
		return err
	case populated && wasDistributed:
		return fmt.Errorf("pgdedup: setup %s: the table is distributed by Citus and holds IDs: moving a populated table runs on plain PostgreSQL only "+
			"(on Citus Setup replaces an empty table)", s.messages.table)
	case populated:
		// Moved online, without the lock below, which claims would queue
		// behind; the old table covers the past.
		if _, err := s.movePopulated(ctx, span); err != nil {
			return err
		}
		s.found.Store(nil)
		_, err := s.createPartitions(ctx, 0)
		return err
	}
	send := func() error {
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		b.Queue(`SELECT pg_catalog.set_config('lock_timeout', '5s', true)`)
		b.Queue(s.setupSQL(span))
		b.Queue(`COMMIT`)
		return s.db.SendBatch(ctx, b).Close()
	}
	err = send()
	// On Citus, Setups of other tables at the same time (dropping and
	// distributing tables in one shard group) may deadlock, and Citus then
	// cancels one: it changed nothing, try again. So does a Setup of another
	// table in the schema that created pgdedup_partitions at the same time
	// (a duplicate name): the next try checks the one it made.
	for try := 1; try < 5 && (isCode(err, "40P01") || isCode(err, "42P07") || isCode(err, "23505")); try++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(try) * 100 * time.Millisecond):
		}
		err = send()
	}
	if err != nil {
		if code, _ := sqlState(err); code != "PGD01" || wasDistributed {
			return fmt.Errorf("pgdedup: setup %s: %w", s.messages.table, withDetail(err))
		}
		// Rows came in since populatedPlain looked: moved online.
		if _, err := s.movePopulated(ctx, span); err != nil {
			return err
		}
	}
	// On Citus, the claim function (see partitionFuncSQL).
	if isDistributed, err := s.distributed(ctx); err != nil {
		return err
	} else if isDistributed {
		if err := s.exec(ctx, partitionFuncSQL(s.partitionFunc, s.messages.table)); err != nil {
			return fmt.Errorf("pgdedup: setup %s: %w", s.messages.table, withDetail(err))
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

// distributed reports whether Citus distributes the table.
func (s *Store) distributed(ctx context.Context) (bool, error) {
	var citus, distributed bool
	err := s.db.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`).Scan(&citus)
	if err == nil && citus {
		err = s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1))`,
			s.messages.table).Scan(&distributed)
	}
	if err != nil {
		return false, fmt.Errorf("pgdedup: setup %s: %w", s.messages.table, withDetail(err))
	}
	return distributed, nil
}

// isCode reports whether err is a database error of SQLSTATE code.
func isCode(err error, code string) bool {
	c, _ := sqlState(err)
	return err != nil && c == code
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
	nspOID := `(SELECT relnamespace FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) t::pg_catalog.oid)`
	keep, keepApply := keepObjectsSQL(`t::pg_catalog.oid`, t, meta)
	return `DO $pgdedup$
DECLARE
    t   pg_catalog.regclass := pg_catalog.to_regclass('` + t + `');
    acl pg_catalog.aclitem[];
    nsp pg_catalog.name;
    rel pg_catalog.name;
    g   record;
    col pg_catalog.text;    -- Citus: the distribution column
    pm  pg_catalog."char";
    trg pg_catalog.bool;
    r   record;
    kept pg_catalog.text[] := '{}';
    stmt pg_catalog.text;
BEGIN
    IF t IS NULL THEN
        RAISE EXCEPTION 'table ` + t + ` not found: run pgdedup.Migrate first';
    END IF;
    -- Created in this transaction, or checked (partition_trust.go).
` + partitionMetaSQL(meta, `t::pg_catalog.oid`) + `    IF (SELECT relkind FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) t::pg_catalog.oid) OPERATOR(pg_catalog.<>) 'p' THEN
        -- On Citus, the same distribution column, shards and co-location
        -- group (the business tables co-located with it).
        IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
            EXECUTE $q$SELECT pg_catalog.column_to_column_name(p.logicalrelid, p.partkey), p.partmethod
                FROM pg_catalog.pg_dist_partition p WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1$q$ INTO col, pm USING t;
            IF pm IS NOT NULL AND pm OPERATOR(pg_catalog.<>) 'h' THEN
                RAISE EXCEPTION 'table ` + t + ` is a Citus table not distributed by hash: the Partitioned layout needs it distributed by a column (see docs/citus.md)';
            END IF;
            PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);
            PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
        END IF;
        LOCK TABLE ` + t + ` IN ACCESS EXCLUSIVE MODE;
        IF EXISTS (SELECT 1 FROM ` + t + `) THEN -- (Citus refuses a SELECT without columns)
            RAISE EXCEPTION USING ERRCODE = 'PGD01', MESSAGE = 'table ` + t + ` holds rows';
        END IF;
` + keep + `        trg := EXISTS (SELECT FROM pg_catalog.pg_trigger WHERE tgrelid OPERATOR(pg_catalog.=) t::pg_catalog.oid
                       AND tgname OPERATOR(pg_catalog.=) 'processed_messages_fill_key');
        SELECT c.relacl, n.nspname, c.relname INTO acl, nsp, rel
        FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
        WHERE c.oid OPERATOR(pg_catalog.=) t::pg_catalog.oid;
` + refuseTakenSQL(nspOID, `t::pg_catalog.oid`, "pgdedup_partitioned_new") + fillKeyCheckSQL(nspOID, `t::pg_catalog.oid`) + `        -- The same columns (00002's included) and defaults, partitioned.
        EXECUTE pg_catalog.format('CREATE TABLE %I.pgdedup_partitioned_new (LIKE %I.%I INCLUDING DEFAULTS) PARTITION BY RANGE (processed_at)',
            nsp, nsp, rel);
        -- 00003's trigger, which fills key for raw-SQL inserts, from the
        -- table's schema, where Migrate put it (unless it was dropped, as
        -- distributing by key does).
        IF trg THEN
            EXECUTE pg_catalog.format('CREATE TRIGGER processed_messages_fill_key BEFORE INSERT ON %I.pgdedup_partitioned_new
                FOR EACH ROW WHEN (NEW.key IS NULL) EXECUTE FUNCTION %I.pgdedup_fill_key()', nsp, nsp);
        END IF;
        IF col IS NOT NULL THEN -- while the old table is there to co-locate with
            EXECUTE pg_catalog.format('SELECT pg_catalog.create_distributed_table(%L, %L, colocate_with => %L)',
                pg_catalog.format('%I.pgdedup_partitioned_new', nsp), col, pg_catalog.format('%I.%I', nsp, rel));
        END IF;
        EXECUTE pg_catalog.format('DROP TABLE %I.%I', nsp, rel);
        EXECUTE pg_catalog.format('ALTER TABLE %I.pgdedup_partitioned_new RENAME TO %I', nsp, rel);
        t := pg_catalog.to_regclass('` + t + `');
` + regrantSQL(t, meta) + keepApply + `
    END IF;
    DELETE FROM ` + meta + ` m WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) m.parent::pg_catalog.oid);
    INSERT INTO ` + meta + ` (parent, span, sealed)
    VALUES (t, ` + spanSQL + `, pg_catalog.date_bin(` + spanSQL + `, pg_catalog.clock_timestamp(), ` + partitionOrigin + `))
    ON CONFLICT (parent) DO NOTHING;
END
$pgdedup$`
}
