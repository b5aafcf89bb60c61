package partitioned

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// Store.Setup on a plain table that holds rows moves it to the partitioned
// shape, online. The old table becomes one partition, the legacy
// partition. It covers claim times from Origin to a switch time T on the
// span grid. T is ahead by at least defaultMoveLead, one span, and twice
// the old table's scan at moveScanRate. No row is copied. No step holds a
// lock that claims wait for longer than moveLockTimeout. There are two
// steps.
//
//  1. CHECK (processed_at >= Origin AND processed_at < T) NOT VALID is a
//     catalog change under ACCESS EXCLUSIVE, tried for moveLockTimeout at a
//     time. VALIDATE CONSTRAINT follows. It is a scan under SHARE UPDATE
//     EXCLUSIVE, which no claim waits for, even queued behind it. So it
//     waits for its lock until the deadline. Claims before T pass the
//     check. A row outside fails the validation. It is given a
//     processed_at inside (moveIntoRange), and the validation runs again.
//  2. One short transaction runs under the same lock_timeout. It renames
//     the old table to the legacy partition's name. It creates the
//     partitioned parent under the old name as setupSQL does, with the
//     columns, defaults, trigger and grants. It attaches the old table FOR
//     VALUES FROM (Origin) TO (T), which the validated check spares a scan
//     of. It drops the check and records the span with sealed = T - span.
//
// The legacy partition keeps its own unique index on key, since a partition
// may have indexes its parent lacks. It keeps its expires_at index too.
// Until T every claim, of either shape, inserts there. A partitioned
// claim's current partition is the legacy one, and its list of unsealed
// older partitions is empty. That list runs from sealed = T - span to
// before the current span. At T the legacy partition is the one before the
// current. Claims copy into it (processed_at T - span) as at any switch.
// Cleanup seals it, and drops it once it ended a Retention ago and all its
// rows expired, as any other. So the argument in partitioned.go holds
// unchanged, with the legacy partition as the partition before T.
//
// A claim with the plain statement inserts through the parent with
// processed_at = now(). It comes from a Store that looked the table up
// before the move, or from an older release. It inserts into the legacy
// partition while that is before T, which is exact. At or after T it is
// not exact. It copies into no older partition. And now() is its
// transaction's start, so it may even land in the legacy partition after
// the seal, unseen by claims that saw the seal. So no plain claim may run
// from T on. Stores look a plain table up again every DefaultLayoutRecheck
// (Store.layouts). The swap gives up unless it commits half the lead
// before T. Older releases must stop by T. Their Cleanup deletes by ctid,
// which repeats across partitions. But it checks expires_at again and
// deletes only expired rows, which is harmless.

const (
	// defaultMoveLead is how far ahead of the move T is at least, and at
	// least one span. It gives every Store time to look the table up again.
	defaultMoveLead = 10 * time.Minute
	// DefaultLayoutRecheck is how often a Store that found the table plain
	// looks it up again.
	DefaultLayoutRecheck = time.Minute
	// moveLockTimeout bounds each wait of the move for a lock that claims
	// queue behind.
	moveLockTimeout = 200 * time.Millisecond
	// moveScanRate is the bytes per second the lead counts on for the
	// validation's scan of the old table, slow on purpose.
	moveScanRate = 25 << 20
)

// MoveTimes are a Store's move lead and layout re-check interval. Zero
// means the defaults. A negative Recheck means never. Tests set it to stand
// in for old code.
type MoveTimes struct{ Lead, Recheck time.Duration }

// moveCheck is the name of the check constraint the move adds for a switch
// at T. The name carries T, so that the swap attaches with the bound its
// own check validated.
func moveCheck(t time.Time) string {
	return "pgdedup_move_before_" + t.UTC().Format("20060102t150405.000000")
}

// movePopulated moves the populated plain table to the partitioned layout
// (see above) and returns T (zero if another Setup moved it first). A step
// that fails after the check was added removes it, so that the plain table
// takes claims after T again.
func (l *Shape) movePopulated(ctx context.Context, span time.Duration) (time.Time, error) {
	var nsp, rel string
	var size int64
	err := l.db.QueryRow(ctx, `SELECT n.nspname::text, c.relname::text, pg_catalog.pg_table_size(c.oid)
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = '`+l.table+`'::pg_catalog.regclass`).Scan(&nsp, &rel, &size)
	if err != nil {
		return time.Time{}, fmt.Errorf("pgdedup: setup %s: %w", l.table, shape.WithDetail(err))
	}
	// Half the lead is left for the validation's scan. A second per
	// moveScanRate bytes is plenty.
	lead := max(cmp.Or(l.move.Lead, defaultMoveLead), span, 2*time.Duration(size/moveScanRate)*time.Second)
	spanSQL := fmt.Sprintf(`'%d microseconds'::pg_catalog.interval`, span.Microseconds())
	leadSQL := fmt.Sprintf(`'%d microseconds'::pg_catalog.interval`, lead.Microseconds())
	var at, dbNow time.Time
	err = l.db.QueryRow(ctx, `SELECT pg_catalog.clock_timestamp(),
pg_catalog.date_bin(`+spanSQL+`, pg_catalog.clock_timestamp() + `+leadSQL+`, `+Origin+`) + `+spanSQL).Scan(&dbNow, &at)
	if err != nil {
		return time.Time{}, fmt.Errorf("pgdedup: setup %s: %w", l.table, shape.WithDetail(err))
	}
	// The swap must commit by then. The clock is the database's, and the
	// wait the client's.
	until := time.Now().Add(at.Add(-lead / 2).Sub(dbNow))
	table := pgx.Identifier{nsp, rel}.Sanitize()
	legacy := partitionName(rel, legacyFrom)
	check := moveCheck(at)
	bound := func(t time.Time) string { return `'` + t.UTC().Format(time.RFC3339Nano) + `'::pg_catalog.timestamptz` }
	fail := func(step string, err error) (time.Time, error) {
		// The check must not outlive the move. After T it would refuse claims.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		drop := `DO $pgdedup$ BEGIN
IF EXISTS (SELECT FROM pg_catalog.pg_constraint WHERE conrelid OPERATOR(pg_catalog.=) '` + table + `'::pg_catalog.regclass::pg_catalog.oid
           AND conname OPERATOR(pg_catalog.=) '` + check + `') THEN
    ALTER TABLE ` + table + ` DROP CONSTRAINT ` + pgx.Identifier{check}.Sanitize() + `;
END IF; END $pgdedup$`
		if derr := l.moveStep(dctx, time.Now().Add(50*time.Second), drop); derr != nil {
			return time.Time{}, fmt.Errorf("pgdedup: setup %s: %s: %w; and removing the check failed (%v): "+
				"drop constraint %s before %s, when it would refuse claims", l.table, step, err, derr, check, at.UTC().Format(time.RFC3339))
		}
		return time.Time{}, fmt.Errorf("pgdedup: setup %s: %s (nothing changed; run Setup again): %w", l.table, step, err)
	}

	// 1. The check, added (replacing one of an interrupted move) and validated.
	add := `DO $pgdedup$
DECLARE c pg_catalog.name;
BEGIN
    IF (SELECT relkind FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) '` + table + `'::pg_catalog.regclass::pg_catalog.oid) OPERATOR(pg_catalog.=) 'p' THEN
        RAISE EXCEPTION USING ERRCODE = 'PGD04', MESSAGE = 'moved already';
    END IF;
    FOR c IN SELECT conname FROM pg_catalog.pg_constraint WHERE conrelid OPERATOR(pg_catalog.=) '` + table + `'::pg_catalog.regclass::pg_catalog.oid
             AND conname OPERATOR(pg_catalog.~) '^pgdedup_move_before_' LOOP
        EXECUTE pg_catalog.format('ALTER TABLE ` + table + ` DROP CONSTRAINT %I', c);
    END LOOP;
    ALTER TABLE ` + table + ` ADD CONSTRAINT ` + pgx.Identifier{check}.Sanitize() + `
        CHECK (processed_at >= ` + bound(legacyFrom) + ` AND processed_at < ` + bound(at) + `) NOT VALID;
END
$pgdedup$`
	if err := l.moveStep(ctx, until, add); err != nil {
		if code, _ := shape.SQLState(err); code == "PGD04" {
			return time.Time{}, nil // by another Setup since populatedPlain looked
		}
		return fail("add the check", err)
	}
	// SHARE UPDATE EXCLUSIVE is a lock no claim waits for, even queued. So
	// it may wait until the deadline. An autovacuum of the table yields to
	// it.
	validate := func() error {
		return l.moveStep(ctx, until, `SELECT pg_catalog.set_config('lock_timeout', '`+
			fmt.Sprint(max(time.Until(until).Milliseconds(), 1))+`ms', true)`,
			`ALTER TABLE `+table+` VALIDATE CONSTRAINT `+pgx.Identifier{check}.Sanitize())
	}
	err = validate()
	if shape.IsCode(err, "23514") {
		// Rows outside the range, from before the check, are moved into it.
		if err = l.moveIntoRange(ctx, until, table, at); err == nil {
			err = validate()
		}
	}
	if err != nil {
		if code, _ := shape.SQLState(err); code == "23514" {
			err = fmt.Errorf("a row's processed_at is before %s or not before the switch at %s: %w",
				legacyFrom.Format(time.DateOnly), at.UTC().Format(time.RFC3339), err)
		}
		return fail("validate the check", err)
	}

	// 2. The swap. pgdedup_partitions is created in its transaction, or
	// checked there (trust.go), as are the names it takes.
	tOID := `'` + table + `'::pg_catalog.regclass::pg_catalog.oid`
	nspOID := `(SELECT relnamespace FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) ` + tOID + `)`
	keep, keepApply := keepObjectsSQL(tOID, table, l.meta)
	swap := `DO $pgdedup$
DECLARE
    acl pg_catalog.aclitem[];
    g   record;
    r   record;
    kept pg_catalog.text[] := '{}';
    stmt pg_catalog.text;
BEGIN
    LOCK TABLE ` + table + ` IN ACCESS EXCLUSIVE MODE;
` + partitionMetaSQL(l.meta, tOID) + refuseTakenSQL(nspOID, tOID, legacy) + fillKeyCheckSQL(nspOID, tOID) + `
    IF pg_catalog.clock_timestamp() >= ` + bound(at.Add(-lead/2)) + ` THEN
        RAISE EXCEPTION USING ERRCODE = 'PGD02', MESSAGE = 'too close to the switch time';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_constraint WHERE conrelid OPERATOR(pg_catalog.=) '` + table + `'::pg_catalog.regclass::pg_catalog.oid
                   AND conname OPERATOR(pg_catalog.=) '` + check + `' AND convalidated) THEN
        RAISE EXCEPTION USING ERRCODE = 'PGD03', MESSAGE = 'the check ` + check + ` is gone: another Setup is at work';
    END IF;
    SELECT c.relacl INTO acl FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) '` + table + `'::pg_catalog.regclass::pg_catalog.oid;
` + keep + `    ALTER TABLE ` + table + ` RENAME TO ` + pgx.Identifier{legacy}.Sanitize() + `;
    CREATE TABLE ` + table + ` (LIKE ` + pgx.Identifier{nsp, legacy}.Sanitize() + ` INCLUDING DEFAULTS) PARTITION BY RANGE (processed_at);
    -- 00003's trigger, on the parent, from which ATTACH clones it.
    DROP TRIGGER IF EXISTS processed_messages_fill_key ON ` + pgx.Identifier{nsp, legacy}.Sanitize() + `;
    CREATE TRIGGER processed_messages_fill_key BEFORE INSERT ON ` + table + `
        FOR EACH ROW WHEN (NEW.key IS NULL) EXECUTE FUNCTION ` + pgx.Identifier{nsp, "pgdedup_fill_key"}.Sanitize() + `();
` + regrantSQL(table, l.meta) + keepApply + `
    ALTER TABLE ` + table + ` ATTACH PARTITION ` + pgx.Identifier{nsp, legacy}.Sanitize() + `
        FOR VALUES FROM (` + bound(legacyFrom) + `) TO (` + bound(at) + `);
    ALTER TABLE ` + pgx.Identifier{nsp, legacy}.Sanitize() + ` DROP CONSTRAINT ` + pgx.Identifier{check}.Sanitize() + `;
    DELETE FROM ` + l.meta + ` m WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) m.parent::pg_catalog.oid);
    INSERT INTO ` + l.meta + ` (parent, span, sealed) VALUES ('` + table + `'::pg_catalog.regclass, ` + spanSQL + `, ` + bound(at) + ` - ` + spanSQL + `);
END
$pgdedup$`
	if err := l.moveStep(ctx, until, swap); err != nil {
		if code, _ := shape.SQLState(err); code == "PGD02" {
			err = fmt.Errorf("the table was not locked in time (it must be %s before the switch at %s): %w", lead/2, at.UTC().Format(time.RFC3339), err)
		}
		return fail("swap in the partitioned table", err)
	}
	l.log.InfoContext(ctx, "pgdedup: moved the table to the partitioned layout: claims with the plain statement (releases before this one) must end by the switch",
		"table", l.table, "legacy_partition", legacy, "switch", at.UTC())
	return at, nil
}

// moveIntoRange gives the rows of the plain table whose processed_at is
// outside the legacy partition's range a processed_at inside it. Such rows
// are before legacyFrom, or at or after the switch at. Only a raw INSERT
// or an import makes them, and any role with INSERT may. Their new
// processed_at is legacyFrom, or the database's clock, which is before at. Their IDs stay claimed, and such a row can no
// longer hold the move off. The move's check, already in force, keeps new
// ones out. Claims wait for no lock of this UPDATE (ROW EXCLUSIVE).
func (l *Shape) moveIntoRange(ctx context.Context, until time.Time, table string, at time.Time) error {
	bound := func(t time.Time) string { return `'` + t.UTC().Format(time.RFC3339Nano) + `'::pg_catalog.timestamptz` }
	err := l.moveStep(ctx, until, `UPDATE `+table+`
SET processed_at = LEAST(GREATEST(processed_at, `+bound(legacyFrom)+`), pg_catalog.clock_timestamp())
WHERE processed_at < `+bound(legacyFrom)+` OR processed_at >= `+bound(at))
	if err == nil {
		l.log.WarnContext(ctx, "pgdedup: rows with a processed_at outside the legacy partition's range were given the move's time",
			"table", l.table, "switch", at.UTC())
	}
	return err
}

// legacyFrom is Origin, the legacy partition's lower bound.
var legacyFrom = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// populatedPlain reports whether the table is a plain table that holds
// rows. It reads twice and takes no lock that claims wait for.
func (l *Shape) populatedPlain(ctx context.Context) (bool, error) {
	var plain bool
	err := l.db.QueryRow(ctx, `SELECT coalesce((SELECT relkind <> 'p' FROM pg_catalog.pg_class WHERE oid = pg_catalog.to_regclass($1)), false)`,
		l.table).Scan(&plain)
	if err == nil && plain {
		err = l.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+l.table+`)`).Scan(&plain)
	}
	if err != nil {
		return false, fmt.Errorf("pgdedup: setup %s: %w", l.table, shape.WithDetail(err))
	}
	return plain, nil
}

// moveStep runs sqls in one transaction under moveLockTimeout (unless they
// set another), again after
// a pause while a lock was not available (or a deadlock), until until.
func (l *Shape) moveStep(ctx context.Context, until time.Time, sqls ...string) error {
	for {
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		b.Queue(fmt.Sprintf(`SELECT pg_catalog.set_config('lock_timeout', '%dms', true)`, moveLockTimeout.Milliseconds()))
		for _, q := range sqls {
			b.Queue(q)
		}
		b.Queue(`COMMIT`)
		err := l.db.SendBatch(ctx, b).Close()
		code, _ := shape.SQLState(err)
		if err == nil || (code != "55P03" && code != "40P01") {
			return err
		}
		if !time.Now().Before(until) {
			return fmt.Errorf("gave up retrying (each wait for a lock at most %s): %w", moveLockTimeout, err)
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-time.After(50*time.Millisecond + rand.N(200*time.Millisecond)):
		}
	}
}

// regrantSQL is PL/pgSQL granting on t (quoted) the privileges in the
// variable acl that their grantors granted to others, as setupSQL does, and
// SELECT on meta to whoever may insert. It needs `g record`.
func regrantSQL(t, meta string) string {
	grantee := `CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)::pg_catalog.text) END`
	return `    FOR g IN SELECT a.privilege_type, a.grantee, a.is_grantable FROM pg_catalog.aclexplode(acl) a
             WHERE a.grantee OPERATOR(pg_catalog.<>) a.grantor LOOP
        EXECUTE pg_catalog.format('GRANT %s ON ` + t + ` TO %s%s', g.privilege_type, ` + grantee + `,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        IF g.privilege_type OPERATOR(pg_catalog.=) 'INSERT' THEN
            EXECUTE pg_catalog.format('GRANT SELECT ON ` + meta + ` TO %s', ` + grantee + `);
        END IF;
    END LOOP;`
}
