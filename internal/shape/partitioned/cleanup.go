package partitioned

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// Cleanup of the partitioned shape deletes no rows. Each run creates the
// partitions of the next spans and seals the partitions before the current
// one. It detaches and drops the sealed partitions whose rows have all
// expired. None of it takes a lock a claim waits for. CREATE TABLE of a
// partition and its indexes lock only the new table. ATTACH and DETACH …
// CONCURRENTLY take SHARE UPDATE EXCLUSIVE on the parent, which does not
// conflict with the ROW EXCLUSIVE of claims. DROP TABLE locks only the
// detached partition, which no claim reads any more. A placement that
// distributes the table detaches in its own way (Placement.Detach).

// Ahead is the fewest partitions after the current one that Cleanup keeps
// created. It keeps as many as the runway asks (Config.Runway, see
// AheadFor), at most MaxAhead. Claims fail (no partition for their time)
// if no Cleanup runs for that long. Partitions ahead cost a claim nothing:
// its statement's upper bound prunes them (bounded.go).
const (
	Ahead    = 3
	MaxAhead = 64
	// createPerRound is the most partitions one round of creation makes,
	// nearest first. A long runway is filled over a few runs, so that no run
	// spends long on DDL, which is distributed on Citus.
	createPerRound = 8
)

// AheadFor is how many partitions ahead of the current one cover runway
// with partitions of span: at least Ahead, at most MaxAhead.
func AheadFor(runway, span time.Duration) int {
	if span <= 0 {
		return Ahead
	}
	return min(max(int((runway+span-1)/span), Ahead), MaxAhead)
}

// defaultSealWait is how long one Cleanup waits for the transactions that
// hold a lock on the table to end before it seals. If some are still open,
// the next run tries again. defaultDetachWait bounds one DETACH …
// CONCURRENTLY (or FINALIZE) likewise. Tests set shorter ones per Store.
const (
	defaultSealWait   = 5 * time.Second
	defaultDetachWait = 5 * time.Second
)

// Waits are a Store's waits of its cleanup, which tests set. Zero waits
// are the defaults.
type Waits struct {
	// Seal bounds the wait for old transactions before sealing.
	Seal time.Duration
	// Detach bounds one DETACH … CONCURRENTLY.
	Detach time.Duration
	// Detached is called with a partition's name between its detach and
	// its DROP TABLE. Tests interrupt a Cleanup there.
	Detached func(partition string)
	// NoCarry keeps partitions with live rows instead of carrying them.
	NoCarry bool
}

// partitionState is the table's row in pgdedup_partitions and its
// partitions, as one Cleanup run reads them.
type partitionState struct {
	span        time.Duration
	sealed      time.Time // every partition ending at or before it is sealed
	current     time.Time // where the partition of the database's clock starts
	schema      string    // the parent's schema and name
	name        string
	parts       []partitionInfo // by start
	distributed string          // the column that distributes the table, or ""
}

// partitionInfo is one partition of the table.
type partitionInfo struct {
	oid     uint32
	name    string // unquoted; in the parent's schema
	from    time.Time
	to      time.Time
	pending bool  // DETACH … CONCURRENTLY interrupted: FINALIZE is left
	rows    int64 // PostgreSQL's estimate (pg_class.reltuples)
	carried bool  // its live rows were copied to a newer partition (carry.go)
}

func (st *partitionState) quoted(name string) string {
	return pgx.Identifier{st.schema, name}.Sanitize()
}

// readPartitions reads the table's partitioning.
func (l *Shape) readPartitions(ctx context.Context) (*partitionState, error) {
	if err := l.checkPartitionMeta(ctx); err != nil {
		return nil, err
	}
	st := &partitionState{}
	err := l.db.QueryRow(ctx, `SELECT p.span, p.sealed, pg_catalog.date_bin(p.span, pg_catalog.clock_timestamp(), `+Origin+`),
n.nspname::text, c.relname::text
FROM `+l.meta+` p JOIN pg_catalog.pg_class c ON c.oid = p.parent::pg_catalog.oid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE p.parent = '`+l.table+`'::pg_catalog.regclass`).Scan(&st.span, &st.sealed, &st.current, &st.schema, &st.name)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("pgdedup: %s is partitioned but %s has no row for it: run Store.Setup", l.table, l.meta)
	}
	if err == nil {
		st.distributed, err = l.Distribution(ctx, l.db, l.table)
	}
	if err != nil {
		return nil, fmt.Errorf("pgdedup: read the partitioning of %s: %w", l.table, shape.WithDetail(err))
	}
	rows, _ := l.db.Query(ctx, `SELECT c.oid, c.relname::text, i.inhdetachpending, b.m[1]::pg_catalog.timestamptz, b.m[2]::pg_catalog.timestamptz,
GREATEST(c.reltuples, 0)::bigint
FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL pg_catalog.regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid),
  'FROM \(''([^'']*)''\) TO \(''([^'']*)''\)') AS b(m)
WHERE i.inhparent = '`+l.table+`'::pg_catalog.regclass ORDER BY 4`)
	var p partitionInfo
	_, err = pgx.ForEachRow(rows, []any{&p.oid, &p.name, &p.pending, &p.from, &p.to, &p.rows}, func() error {
		st.parts = append(st.parts, p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgdedup: read the partitions of %s: %w", l.table, shape.WithDetail(err))
	}
	return st, nil
}

// Cleanup is Store.Cleanup on the partitioned shape. deleted is the rows of
// the partitions it dropped (PostgreSQL's estimates). It sets e's Created
// and Dropped.
func (l *Shape) Cleanup(ctx context.Context, e *shape.Report) (deleted int64, skipped bool, err error) {
	e.Created, e.Dropped = []shape.Span{}, []shape.Span{}
	created, err := l.createPartitions(ctx, 0, 0)
	e.Created = append(e.Created, created...)
	// Starved creation, like starved sealing, is reported once the rest is
	// done.
	var starved error
	if errors.Is(err, shape.ErrCleanupStarved) {
		starved, err = err, nil
	}
	if err != nil {
		return 0, false, err
	}
	st, err := l.readPartitions(ctx)
	if err != nil {
		return 0, false, err
	}
	sealedBefore, waiting, err := l.sealPartitions(ctx, st)
	// Starved sealing is reported once the rest is done.
	if errors.Is(err, shape.ErrCleanupStarved) {
		starved, err = errors.Join(starved, err), nil
	}
	if err != nil {
		return 0, false, err
	}
	dropped, deleted, err := l.dropOrphans(ctx, st)
	if err == nil {
		var more []shape.Span
		var rows int64
		more, rows, err = l.dropPartitions(ctx, st)
		dropped, deleted = append(dropped, more...), deleted+rows
	}
	e.Dropped = append(e.Dropped, dropped...)
	l.log.InfoContext(ctx, "pgdedup: partitions", "table", l.table, "created", spanNames(created),
		"sealed_before", sealedBefore.UTC(), "seal_waits_for", waiting, "dropped", spanNames(dropped), "rows_dropped", deleted)
	return deleted, false, errors.Join(err, starved)
}

// spanNames are the names of ps, for logs.
func spanNames(ps []shape.Span) []string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return names
}

// partitionName is the name of the partition starting at from. It is the
// parent's name and from in UTC, so that names sort by time. A parent's name longer
// than 30 bytes is cut to 21 and followed by a hash of the whole name
// (shortPrefix), so that tables with a long common prefix do not collide and
// the partition's index names fit PostgreSQL's 63 bytes.
func partitionName(parent string, from time.Time) string {
	name := shortPrefix(parent) + "_p" + from.UTC().Format("20060102t150405")
	if ms := from.Nanosecond() / int(time.Millisecond); ms != 0 || from.Nanosecond() != 0 {
		name += fmt.Sprintf("m%03d", ms)
	}
	return name
}

// shortPrefix is the parent's name as partition names begin with it. That
// is the name itself up to 30 bytes. A longer name gives its first 21
// bytes, "_" and the first 8 hex digits of the SHA-256 of the name (30
// bytes).
func shortPrefix(parent string) string {
	if len(parent) <= 30 {
		return parent
	}
	sum := sha256.Sum256([]byte(parent))
	return parent[:21] + "_" + hex.EncodeToString(sum[:4])
}

// partitionNameV1 is the name releases before the hash gave the partition
// starting at from (the parent's name cut to 30 bytes). Such partitions are
// found through pg_inherits and work as any. Only the orphan check
// (orphans.go) looks at their names.
func partitionNameV1(parent string, from time.Time) string {
	if len(parent) <= 30 {
		return partitionName(parent, from)
	}
	return parent[:30] + strings.TrimPrefix(partitionName(parent, from), shortPrefix(parent))
}

// createPartitions creates the partitions from the current one to ahead
// after it (zero: the runway's end, AheadFor) that are missing, nearest
// first and createPerRound at most per round (and, given back, one covering
// back before the current one if none is older), each as a table of its own with
// its unique index on key and index on expires_at, then attached, each in a
// transaction of its own. It returns the partitions it created, oldest
// first, and an error wrapping shape.ErrCleanupStarved if a lock held some up.
func (l *Shape) createPartitions(ctx context.Context, back time.Duration, ahead int) ([]shape.Span, error) {
	// Creating partitions can take longer than a span (distributed DDL on a
	// loaded Citus cluster). So once a round has created some, the next
	// counts the partitions ahead again from the current one, until a round
	// creates none.
	var all []shape.Span
	for round := 0; round < 4; round++ {
		made, err := l.createPartitionsOnce(ctx, back, ahead)
		all = append(all, made...)
		if err != nil || len(made) == 0 {
			return all, err
		}
		back = 0
	}
	return all, nil
}

// createPartitionsOnce is one round of createPartitions.
func (l *Shape) createPartitionsOnce(ctx context.Context, back time.Duration, ahead int) ([]shape.Span, error) {
	st, err := l.readPartitions(ctx)
	if err != nil {
		return nil, err
	}
	// A partition may span several spans, as the legacy partition of a
	// moved table does (move.go). Nothing may overlap it.
	covered := func(from time.Time) bool {
		return slices.ContainsFunc(st.parts, func(p partitionInfo) bool { return !from.Before(p.from) && from.Before(p.to) })
	}
	var created []shape.Span
	// One partition for the past (back, in whole spans) is made when there
	// is none, for IDs imported with their times. It is sealed from the
	// start.
	if back > 0 && (len(st.parts) == 0 || !st.parts[0].from.Before(st.current)) {
		from := st.current.Add(-(back + st.span - 1) / st.span * st.span)
		created = append(created, shape.Span{Name: partitionName(st.name, from), From: from.UTC(), To: st.current.UTC()})
	}
	if ahead == 0 {
		ahead = AheadFor(l.runway, st.span)
	}
	for k := range ahead + 1 {
		from := st.current.Add(time.Duration(k) * st.span)
		if !covered(from) && len(created) < createPerRound {
			created = append(created, shape.Span{Name: partitionName(st.name, from), From: from.UTC(), To: from.Add(st.span).UTC()})
		}
	}
	if len(created) == 0 {
		return nil, nil
	}
	// Each partition is made in a transaction of its own, which needs no
	// turn. Concurrent cleaners may create the same one, and the losers find
	// the winner's (createPartition).
	made := created[:0]
	var blocked []string
	for i, p := range created {
		mine, err := l.createPartition(ctx, st, p)
		switch {
		case shape.IsCode(err, "55P03") && l.cleanerCreating(ctx):
			// Another cleaner holds the lock to create partitions. It
			// creates the rest, and reports it if it is held up itself.
			return made, nil
		case shape.IsCode(err, "55P03"):
			// The rest would wait for the same lock.
			for _, q := range created[i:] {
				blocked = append(blocked, q.Name)
			}
		case err != nil:
			return made, fmt.Errorf("pgdedup: create partition %s of %s: %w", p.Name, l.table, shape.WithDetail(err))
		case mine:
			made = append(made, p)
		}
		if len(blocked) > 0 {
			break
		}
	}
	if len(blocked) > 0 {
		return made, l.creationStarved(ctx, st, made, blocked)
	}
	return made, nil
}

// createLockTimeout bounds creation's wait for its lock on the parent. It
// is a second longer than another cleaner's detach may hold it
// (Waits.Detach). So only a session holding it longer makes Cleanup
// starved. Claims do not wait behind it (SHARE UPDATE EXCLUSIVE).
func (l *Shape) createLockTimeout() time.Duration {
	return cmp.Or(l.waits.Detach, defaultDetachWait) + time.Second
}

// partitionCreatedSetting is set, until the transaction that created a
// partition ends, to say that it did.
const partitionCreatedSetting = "pgdedup.partition_created"

// createPartition creates partition p in a transaction of its own (see
// createPartitionSQL). It reports whether this call created it. False means
// it was there, and checked. It tries again when another session created
// the same name at the same time (duplicate errors), or on a deadlock.
func (l *Shape) createPartition(ctx context.Context, st *partitionState, p shape.Span) (mine bool, err error) {
	for try := 0; ; try++ {
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		b.Queue(fmt.Sprintf(`SELECT pg_catalog.set_config('lock_timeout', '%dms', true)`, l.createLockTimeout().Milliseconds()))
		b.Queue(l.createPartitionSQL(st, p.Name, p.From, p.To))
		b.Queue(`SELECT coalesce(pg_catalog.current_setting('` + partitionCreatedSetting + `', true), '') = 'true'`).QueryRow(func(row pgx.Row) error {
			return row.Scan(&mine)
		})
		b.Queue(`COMMIT`)
		err = l.db.SendBatch(ctx, b).Close()
		if try >= 3 || !(shape.IsCode(err, "42P07") || shape.IsCode(err, "23505") || shape.IsCode(err, "42710") || shape.IsCode(err, "40P01")) {
			return mine && err == nil, err
		}
	}
}

// createPartitionSQL creates partition name, from ≤ processed_at < to, in
// the caller's transaction. If the table has a partition of that name
// already, it checks it (checkPartitionSQL) and stops. Otherwise each name
// it takes must be free (refuseTakenSQL). It creates the table, its unique
// index on key and its index on expires_at, and attaches it. ATTACH takes
// SHARE UPDATE EXCLUSIVE on the parent, and claims go on. It takes that
// lock first, so that cleaners racing for a partition take turns. Only
// roles that may change the table's rows can take it. It also takes the
// cleaners' advisory lock if it is free, only so that sealing does not wait
// for it (waitLockers). Whoever holds that lock does not hold creation up.
func (l *Shape) createPartitionSQL(st *partitionState, name string, from, to time.Time) string {
	parent, q := l.table, st.quoted(name)
	// A distributed table wants its distribution column in every unique
	// index.
	unique, columns := "key", []string{"key"}
	if st.distributed != "" && st.distributed != "key" {
		unique += ", " + pgx.Identifier{st.distributed}.Sanitize()
		columns = append(columns, st.distributed)
	}
	t := `'` + parent + `'::pg_catalog.regclass::pg_catalog.oid`
	bound := func(t time.Time) string { return `'` + t.UTC().Format(time.RFC3339Nano) + `'` }
	lock := `LOCK TABLE ONLY ` + parent + ` IN SHARE UPDATE EXCLUSIVE MODE`
	if st.distributed != "" {
		lock = l.AttachLock(parent)
	}
	return `DO $pgdedup$
DECLARE
    r record;
BEGIN
    -- The lock ATTACH takes, taken first: concurrent cleaners create one
    -- partition at a time, and the next one finds it attached. Claims take
    -- ROW EXCLUSIVE, which it does not conflict with.
    ` + lock + `;
    PERFORM pg_catalog.pg_try_advisory_xact_lock(` + shape.CleanupLockClass + `, ` + t + `::pg_catalog.int4);
` + checkPartitionSQL(t, name, columns...) +
		refuseTakenSQL(`(SELECT relnamespace FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) `+t+`)`, t, name, name+"_key", name+"_exp") + `
    CREATE TABLE ` + q + ` (LIKE ` + parent + ` INCLUDING DEFAULTS);
    CREATE UNIQUE INDEX ` + pgx.Identifier{name + "_key"}.Sanitize() + ` ON ` + q + ` (` + unique + `);
    CREATE INDEX ` + pgx.Identifier{name + "_exp"}.Sanitize() + ` ON ` + q + ` (expires_at);
    ALTER TABLE ` + parent + ` ATTACH PARTITION ` + q + ` FOR VALUES FROM (` + bound(from) + `) TO (` + bound(to) + `);
    PERFORM pg_catalog.set_config('` + partitionCreatedSetting + `', 'true', true);
END
$pgdedup$`
}

// sealPartitions seals every partition before the current one. It lists
// the transactions holding a lock on the table now, after the current
// partition began (st.current was read before). It waits up to Waits.Seal
// for all of them to end. Then it moves sealed to the current partition's
// start. Any claim that chose an older partition as its current one read
// the clock while holding its lock on the table. So it was listed, or had
// ended before the list was taken. It returns where sealed stands, and how
// many listed transactions were still open if it gave up. err wraps
// ErrCleanupStarved if sealing is held up for too long (starved.go).
func (l *Shape) sealPartitions(ctx context.Context, st *partitionState) (sealed time.Time, waiting int, err error) {
	if !st.sealed.Before(st.current) {
		return st.sealed, 0, nil
	}
	wait := cmp.Or(l.waits.Seal, boundedWait(defaultSealWait, st.span))
	deadline := time.Now().Add(wait)
	open, err := l.waitLockers(ctx, wait)
	var prepared []string // see Placement.WaitPrepared
	if err == nil && len(open) == 0 && st.distributed != "" {
		prepared, err = l.WaitPrepared(ctx, l.db, l.table, st.schema, st.name, max(time.Until(deadline), 0))
	}
	if waiting = len(open) + len(prepared); err != nil || waiting > 0 {
		if err == nil {
			l.log.InfoContext(ctx, "pgdedup: sealing waits for transactions", "table", l.table, "open", waiting)
			err = l.sealStarved(ctx, st, open, prepared)
		}
		return st.sealed, waiting, err
	}
	err = shape.Exec(ctx, l.db, `UPDATE `+l.meta+` SET sealed = $1
WHERE parent = '`+l.table+`'::pg_catalog.regclass AND sealed < $1`, st.current)
	if err != nil {
		return st.sealed, 0, fmt.Errorf("pgdedup: seal partitions of %s: %w", l.table, shape.WithDetail(err))
	}
	st.sealed = st.current
	return st.sealed, 0, nil
}

// waitLockers lists the transactions holding a lock on the table now and
// waits up to d for all of them to end, polling pg_locks (it holds no lock
// itself). It returns those still open when it gave up (virtualtransaction).
func (l *Shape) waitLockers(ctx context.Context, d time.Duration) (open []string, err error) {
	// A lock on the table in a mode claims take counts, and so does a
	// claim's advisory lock (see ClaimLockClass). A cleaner creating
	// partitions does not. It holds the cleaners' advisory lock when it is
	// free, as a mark (see createPartitionSQL). On a distributed table it
	// takes long enough to hold sealing up.
	oid := `'` + l.table + `'::pg_catalog.regclass::pg_catalog.oid`
	from := `FROM pg_catalog.pg_locks WHERE database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
AND virtualtransaction NOT IN (SELECT virtualtransaction FROM pg_catalog.pg_locks WHERE locktype = 'advisory'
AND classid = ` + shape.CleanupLockClass + `::pg_catalog.oid AND objid = ` + oid + ` AND objsubid = 2 AND mode = 'ExclusiveLock')
AND (locktype = 'relation' AND relation = ` + oid + `
AND mode IN ('AccessShareLock', 'RowShareLock', 'RowExclusiveLock')
OR locktype = 'advisory' AND classid = ` + ClaimLockClass + `::pg_catalog.oid
AND objid = ` + oid + ` AND objsubid = 2)`
	var listed []string
	if err := l.db.QueryRow(ctx, `SELECT coalesce(pg_catalog.array_agg(DISTINCT virtualtransaction), '{}') `+from+
		` AND pid IS DISTINCT FROM pg_catalog.pg_backend_pid()`).Scan(&listed); err != nil {
		return nil, fmt.Errorf("pgdedup: partitions of %s: list transactions: %w", l.table, shape.WithDetail(err))
	}
	deadline := time.Now().Add(d)
	for pause := time.Millisecond; len(listed) > 0; pause = min(2*pause, 100*time.Millisecond) {
		if err := l.db.QueryRow(ctx, `SELECT coalesce(pg_catalog.array_agg(DISTINCT virtualtransaction), '{}') `+from+
			` AND virtualtransaction = ANY ($1::text[])`, listed).Scan(&listed); err != nil {
			return nil, fmt.Errorf("pgdedup: partitions of %s: wait for transactions: %w", l.table, shape.WithDetail(err))
		}
		if len(listed) == 0 || time.Now().After(deadline) {
			return listed, nil
		}
		select {
		case <-ctx.Done():
			return listed, ctx.Err()
		case <-time.After(pause):
		}
	}
	return nil, nil
}

// dropPartitions detaches (CONCURRENTLY) and drops the sealed partitions
// that ended a Retention ago and whose rows have all expired, oldest first.
// One that still holds a live row is skipped, not waited for. Its live
// rows are carried forward first, or it is kept (carryLive). A partition
// left pending by an interrupted detach is finalized first, since
// PostgreSQL lets one partition of a table be pending detach at a time. A
// detach that waits longer than Waits.Detach for old transactions is
// cancelled and left to the next run. It returns the partitions it dropped and their rows
// (PostgreSQL's estimates).
func (l *Shape) dropPartitions(ctx context.Context, st *partitionState) (dropped []shape.Span, rows int64, err error) {
	parts := slices.Clone(st.parts)
	slices.SortStableFunc(parts, func(a, b partitionInfo) int {
		if a.pending != b.pending {
			if a.pending {
				return -1
			}
			return 1
		}
		return 0
	})
	for _, p := range parts {
		// It must be sealed, and a Retention (this Store's) past its end.
		// Before that it may hold IDs imported with their times, or rows to
		// come.
		if p.to.After(st.sealed) || p.to.Add(l.retention).After(st.current) {
			break
		}
		if !p.pending {
			if keep, err := l.carryLive(ctx, st, &p); err != nil {
				return dropped, rows, err
			} else if keep {
				continue
			}
		}
		mine, done, err := l.detachPartition(ctx, st, p)
		if err != nil || done {
			return dropped, rows, err
		}
		if l.waits.Detached != nil && mine {
			l.waits.Detached(p.name)
		}
		if err := l.dropDetached(ctx, st, p); err != nil {
			return dropped, rows, err
		}
		if mine {
			dropped = append(dropped, shape.Span{Name: p.name, From: p.from.UTC(), To: p.to.UTC()})
			rows += p.rows
		}
	}
	return dropped, rows, nil
}

// detachPartition detaches p with DETACH … CONCURRENTLY, or FINALIZE if p
// is pending. mine says this run detached it, not another cleaner. done
// says this run goes no further. That is so for a live row in p, old
// transactions still open, or the detach cut short. err says why only if
// it is an error.
func (l *Shape) detachPartition(ctx context.Context, st *partitionState, p partitionInfo) (mine, done bool, err error) {
	q := st.quoted(p.name)
	wait := cmp.Or(l.waits.Detach, boundedWait(defaultDetachWait, st.span))
	detach := `ALTER TABLE ` + l.table + ` DETACH PARTITION ` + q + ` FINALIZE`
	if p.pending {
		// FINALIZE locks the partition before it waits for the transactions
		// that may still read it, which then deadlock with it. So they end
		// first. Later ones never see the partition.
		open, err := l.waitLockers(ctx, wait)
		if err != nil || len(open) > 0 {
			l.log.InfoContext(ctx, "pgdedup: detach waits for transactions", "partition", p.name, "open", len(open))
			return false, true, err
		}
	} else {
		var live bool
		if err := l.db.QueryRow(ctx, liveSQL(st, l.table, p)).Scan(&live); err != nil {
			return false, true, fmt.Errorf("pgdedup: drop partition %s: %w", p.name, shape.WithDetail(err))
		}
		if live {
			return false, true, nil
		}
		detach = `ALTER TABLE ` + l.table + ` DETACH PARTITION ` + q + ` CONCURRENTLY`
	}
	// Marked first, so that a run stopped before its DROP TABLE leaves a
	// table the next one recognizes (orphans.go).
	err = l.markDetach(ctx, st, p)
	switch {
	case err != nil:
	case st.distributed != "":
		err = l.Detach(ctx, l.db, l.table, q)
	default:
		err = l.execAlone(ctx, wait, detach)
	}
	switch code, _ := shape.SQLState(err); {
	case err == nil:
		return true, false, nil
	case code == "42P01":
		return false, false, nil // another cleaner detached it (and drops it, as this one does)
	case code == "57014" || code == "55P03" || code == "55000" || code == "40P01":
		// It was cancelled after the detach wait, or the lock wait is over,
		// or another cleaner's detach is pending. The next run goes on.
		l.log.InfoContext(ctx, "pgdedup: detach left to the next cleanup", "partition", p.name, "error", err)
		return false, true, ctx.Err()
	default:
		return false, true, fmt.Errorf("pgdedup: detach partition %s: %w", p.name, shape.WithDetail(err))
	}
}

// dropDetached drops p once detached, waiting for its lock at most 2s.
func (l *Shape) dropDetached(ctx context.Context, st *partitionState, p partitionInfo) error {
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`SELECT pg_catalog.set_config('lock_timeout', '2s', true)`)
	b.Queue(`DROP TABLE IF EXISTS ` + st.quoted(p.name))
	b.Queue(`COMMIT`)
	if err := l.db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("pgdedup: drop detached partition %s: %w", p.name, shape.WithDetail(err))
	}
	return nil
}

// execAlone runs sql as a statement of its own and cancels it on the
// server after d. DETACH … CONCURRENTLY may not run in a transaction block.
// On a pool the connection used is closed if the cancel was sent. So a
// late cancel cannot hit the next statement.
func (l *Shape) execAlone(ctx context.Context, d time.Duration, sql string) error {
	conn := l.conn
	switch {
	case l.pool != nil:
		c, err := l.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer c.Release()
		conn = c.Conn()
	case conn == nil:
		tctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		return shape.Exec(tctx, l.db, sql)
	}
	cancelled := make(chan struct{})
	t := time.AfterFunc(d, func() {
		defer close(cancelled)
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.PgConn().CancelRequest(cctx)
	})
	_, err := conn.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol)
	if !t.Stop() {
		<-cancelled
		if l.pool != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
		}
	}
	return err
}

// Sizes fills in st's sizes, dead tuples and partitions from the
// partitions. The parent itself stores nothing.
func (l *Shape) Sizes(ctx context.Context, stats *shape.Sizes) error {
	st, err := l.readPartitions(ctx)
	if err != nil {
		return err
	}
	counts := map[uint32]int64{}
	var oid uint32
	var n int64
	if st.distributed == "" {
		rows, _ := l.db.Query(ctx, `SELECT tableoid, count(*) FROM `+l.table+` GROUP BY 1`)
		if _, err := pgx.ForEachRow(rows, []any{&oid, &n}, func() error { counts[oid] = n; return nil }); err != nil {
			return fmt.Errorf("pgdedup: stats of %s: count rows per partition: %w", l.table, shape.WithDetail(err))
		}
	}
	stats.PartitionSpan = st.span
	stats.SealedBefore = shape.Ptr(st.sealed.UTC())
	stats.Partitions = []shape.PartitionSize{}
	for _, p := range st.parts {
		q := st.quoted(p.name)
		ps := shape.PartitionSize{Name: p.name, From: p.from.UTC(), To: p.to.UTC(), Sealed: !p.to.After(st.sealed), Detaching: p.pending}
		var tb, ib, dead int64
		sizes := `SELECT pg_catalog.pg_table_size(r), pg_catalog.pg_indexes_size(r),
coalesce((SELECT n_dead_tup FROM pg_catalog.pg_stat_user_tables WHERE relid = r), 0)
FROM pg_catalog.to_regclass($1::text) r`
		if st.distributed != "" {
			// The shards' sizes and rows. A shard's tableoid is the
			// node's own.
			sizes = l.SizesSQL()
			if err := l.db.QueryRow(ctx, `SELECT count(*) FROM `+q).Scan(&n); err != nil {
				return fmt.Errorf("pgdedup: stats of %s: partition %s: %w", l.table, p.name, shape.WithDetail(err))
			}
			counts[p.oid] = n
		}
		err := l.db.QueryRow(ctx, sizes, q).Scan(&tb, &ib, &dead)
		if err != nil {
			return fmt.Errorf("pgdedup: stats of %s: partition %s: %w", l.table, p.name, shape.WithDetail(err))
		}
		ps.Bytes = tb + ib
		stats.TableBytes += tb
		stats.IndexBytes += ib
		stats.TotalBytes += tb + ib
		stats.DeadTuples += dead
		ps.Rows = counts[p.oid]
		stats.Partitions = append(stats.Partitions, ps)
	}
	stats.PartitionRunway = shape.Ptr(runwayLeft(stats.Partitions, stats.Now))
	return nil
}

// runwayLeft is how long after now claims find a partition if no cleanup
// runs. It runs to the end of the unbroken run of attached partitions that
// holds now. A partition being detached takes no claims. It is zero when
// none holds now.
func runwayLeft(parts []shape.PartitionSize, now time.Time) time.Duration {
	at := now
	for {
		i := slices.IndexFunc(parts, func(p shape.PartitionSize) bool { return !p.Detaching && !at.Before(p.From) && at.Before(p.To) })
		if i < 0 {
			return at.Sub(now)
		}
		at = parts[i].To
	}
}
