package partitioned

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// Setup replaces the empty plain table by a partitioned one with partitions
// of span, or moves a populated one online (move.go). It then creates the
// partitions ahead, and those of the past Retention. relook is called
// whenever the table's shape changed, so that the Store looks it up again.
// pgdedup.Store.Setup says the rest.
func (l *Shape) Setup(ctx context.Context, span time.Duration, relook func()) error {
	wasDistributed, err := l.distributed(ctx)
	if err != nil {
		return err
	}
	populated, err := l.populatedPlain(ctx)
	switch {
	case err != nil:
		return err
	case populated && wasDistributed:
		return l.RefusePopulated(l.table)
	case populated:
		// It is moved online, without the lock below, which claims would
		// queue behind. The old table covers the past.
		if _, err := l.movePopulated(ctx, span); err != nil {
			return err
		}
		relook()
		_, err := l.createPartitions(ctx, 0, Ahead)
		return err
	}
	send := func() error {
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		b.Queue(`SELECT pg_catalog.set_config('lock_timeout', '5s', true)`)
		b.Queue(l.setupSQL(span))
		b.Queue(`COMMIT`)
		return l.db.SendBatch(ctx, b).Close()
	}
	err = send()
	// A distributed table's Setup may deadlock with Setups of other tables
	// in its shard group, and one is cancelled. It changed nothing, so it
	// tries again. So does a Setup of another table in the schema that
	// created pgdedup_partitions at the same time (a duplicate name). The
	// next try checks the one it made.
	for try := 1; try < 5 && (shape.IsCode(err, "40P01") || shape.IsCode(err, "42P07") || shape.IsCode(err, "23505")); try++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(try) * 100 * time.Millisecond):
		}
		err = send()
	}
	if err != nil {
		if code, _ := shape.SQLState(err); code != "PGD01" || wasDistributed {
			return fmt.Errorf("pgdedup: setup %s: %w", l.table, shape.WithDetail(err))
		}
		// Rows came in since populatedPlain looked, so it is moved online.
		if _, err := l.movePopulated(ctx, span); err != nil {
			return err
		}
	}
	// What the placement's claims call, if it has its own.
	if isDistributed, err := l.distributed(ctx); err != nil {
		return err
	} else if isDistributed {
		if err := l.CreateClaims(ctx, l.db, l.table); err != nil {
			return fmt.Errorf("pgdedup: setup %s: %w", l.table, shape.WithDetail(err))
		}
	}
	relook()
	// Partitions for the past Retention are made too, for IDs imported
	// with their original times. They are sealed already, and no claim
	// chooses them.
	// Setup makes the fewest ahead; cleanups fill the runway.
	if _, err := l.createPartitions(ctx, l.retention, Ahead); err != nil {
		return err
	}
	return nil
}

// distributed reports whether the placement distributes the table.
func (l *Shape) distributed(ctx context.Context) (bool, error) {
	distributed, err := l.Distributed(ctx, l.db, l.table)
	if err != nil {
		return false, fmt.Errorf("pgdedup: setup %s: %w", l.table, shape.WithDetail(err))
	}
	return distributed, nil
}

// setupSQL is the DO block that replaces the empty plain table by the
// partitioned one, in the transaction Setup opens, with the plain table
// locked (ACCESS EXCLUSIVE, waiting at most lock_timeout) while it checks
// that it is empty. The privileges granted on the plain table are granted
// again on the new one. Whoever may insert also gets SELECT on
// pgdedup_partitions, which every claim reads. Built-ins are named with
// their schema. The trigger is 00003's, which fills key for raw-SQL
// inserts. The placement may add its own steps (Placement.SetupSQL).
func (l *Shape) setupSQL(span time.Duration) string {
	t, meta := l.table, l.meta
	spanSQL := fmt.Sprintf(`'%d microseconds'::pg_catalog.interval`, span.Microseconds())
	nspOID := `(SELECT relnamespace FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) t::pg_catalog.oid)`
	keep, keepApply := keepObjectsSQL(`t::pg_catalog.oid`, t, meta)
	prepare, distribute := l.SetupSQL(t)
	return `DO $pgdedup$
DECLARE
    t   pg_catalog.regclass := pg_catalog.to_regclass('` + t + `');
    acl pg_catalog.aclitem[];
    nsp pg_catalog.name;
    rel pg_catalog.name;
    g   record;
    col pg_catalog.text;    -- the distribution column, if any
    pm  pg_catalog."char";
    trg pg_catalog.bool;
    r   record;
    kept pg_catalog.text[] := '{}';
    stmt pg_catalog.text;
BEGIN
    IF t IS NULL THEN
        RAISE EXCEPTION 'table ` + t + ` not found: run pgdedup.Migrate first';
    END IF;
    -- Created in this transaction, or checked (trust.go).
` + partitionMetaSQL(meta, `t::pg_catalog.oid`) + `    IF (SELECT relkind FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) t::pg_catalog.oid) OPERATOR(pg_catalog.<>) 'p' THEN
` + prepare + `        LOCK TABLE ` + t + ` IN ACCESS EXCLUSIVE MODE;
        IF EXISTS (SELECT 1 FROM ` + t + `) THEN -- (a distributed table refuses a SELECT without columns)
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
` + distribute + `        EXECUTE pg_catalog.format('DROP TABLE %I.%I', nsp, rel);
        EXECUTE pg_catalog.format('ALTER TABLE %I.pgdedup_partitioned_new RENAME TO %I', nsp, rel);
        t := pg_catalog.to_regclass('` + t + `');
` + regrantSQL(t, meta) + keepApply + `
    END IF;
    DELETE FROM ` + meta + ` m WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) m.parent::pg_catalog.oid);
    INSERT INTO ` + meta + ` (parent, span, sealed)
    VALUES (t, ` + spanSQL + `, pg_catalog.date_bin(` + spanSQL + `, pg_catalog.clock_timestamp(), ` + Origin + `))
    ON CONFLICT (parent) DO NOTHING;
END
$pgdedup$`
}
