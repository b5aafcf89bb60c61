package pgdedup

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
	"github.com/jackc/pgx/v5/pgxpool"
)

// Cleanup of the partitioned layout (partitioned.go): no DELETE. Each run
// creates the partitions of the next spans, seals the partitions before the
// current one, and detaches and drops the sealed partitions whose rows have
// all expired. None of it takes a lock a claim waits for: CREATE TABLE of a
// partition and its indexes lock only the new table, ATTACH and DETACH …
// CONCURRENTLY take SHARE UPDATE EXCLUSIVE on the parent (claims take ROW
// EXCLUSIVE, which it does not conflict with), and DROP TABLE locks only the
// detached partition, which no claim reads any more. On Citus, which refuses
// DETACH … CONCURRENTLY, the plain DETACH holds claims up to its lock
// timeout per node (detachCitus).

// partitionsAhead is how many partitions after the current one Cleanup keeps
// created: claims fail (no partition for their time) if no Cleanup runs for
// that many spans. Every partition that exists is locked by every claim's
// look-up (PostgreSQL locks all partitions of a generic plan), so the count
// is kept small.
const partitionsAhead = 3

// defaultSealWait is how long one Cleanup waits for the transactions that
// hold a lock on the table to end before it seals; if some are still open,
// the next run tries again. defaultDetachWait bounds one DETACH …
// CONCURRENTLY (or FINALIZE) likewise. Tests set shorter ones per Store.
const (
	defaultSealWait   = 5 * time.Second
	defaultDetachWait = 5 * time.Second
)

// partitionWaits are a Store's sealWait and detachWait (zero: the
// defaults), and detached, which tests set to interrupt a Cleanup between
// a detach and its DROP TABLE: called with the partition's name. noCarry,
// set by tests, keeps partitions with live rows instead of carrying them.
type partitionWaits struct {
	seal, detach time.Duration
	detached     func(partition string)
	noCarry      bool
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
	citus       bool            // Citus is installed
	distributed string          // the column Citus distributes the table by, or ""
}

// partitionInfo is one partition of the table.
type partitionInfo struct {
	oid     uint32
	name    string // unquoted; in the parent's schema
	from    time.Time
	to      time.Time
	pending bool  // DETACH … CONCURRENTLY interrupted: FINALIZE is left
	rows    int64 // PostgreSQL's estimate (pg_class.reltuples)
	carried bool  // its live rows were copied to a newer partition (partition_carry.go)
}

func (st *partitionState) quoted(name string) string {
	return pgx.Identifier{st.schema, name}.Sanitize()
}

// readPartitions reads the table's partitioning.
func (s *Store) readPartitions(ctx context.Context) (*partitionState, error) {
	if err := s.checkPartitionMeta(ctx); err != nil {
		return nil, err
	}
	st := &partitionState{}
	err := s.db.QueryRow(ctx, `SELECT p.span, p.sealed, pg_catalog.date_bin(p.span, pg_catalog.clock_timestamp(), `+partitionOrigin+`),
n.nspname::text, c.relname::text
FROM `+s.partitionMeta+` p JOIN pg_catalog.pg_class c ON c.oid = p.parent::pg_catalog.oid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE p.parent = '`+s.messages.table+`'::pg_catalog.regclass`).Scan(&st.span, &st.sealed, &st.current, &st.schema, &st.name)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("pgdedup: %s is partitioned but %s has no row for it: run Store.Setup", s.messages.table, s.partitionMeta)
	}
	if err == nil {
		err = s.db.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`).Scan(&st.citus)
	}
	if err == nil && st.citus {
		err = s.db.QueryRow(ctx, `SELECT coalesce((SELECT pg_catalog.column_to_column_name(logicalrelid, partkey)
FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1::pg_catalog.regclass), '')`, s.messages.table).Scan(&st.distributed)
	}
	if err != nil {
		return nil, fmt.Errorf("pgdedup: read the partitioning of %s: %w", s.messages.table, withDetail(err))
	}
	rows, _ := s.db.Query(ctx, `SELECT c.oid, c.relname::text, i.inhdetachpending, b.m[1]::pg_catalog.timestamptz, b.m[2]::pg_catalog.timestamptz,
GREATEST(c.reltuples, 0)::bigint
FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL pg_catalog.regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid),
  'FROM \(''([^'']*)''\) TO \(''([^'']*)''\)') AS b(m)
WHERE i.inhparent = '`+s.messages.table+`'::pg_catalog.regclass ORDER BY 4`)
	var p partitionInfo
	_, err = pgx.ForEachRow(rows, []any{&p.oid, &p.name, &p.pending, &p.from, &p.to, &p.rows}, func() error {
		st.parts = append(st.parts, p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgdedup: read the partitions of %s: %w", s.messages.table, withDetail(err))
	}
	return st, nil
}

// cleanupPartitioned is Cleanup on the partitioned layout; deleted is the
// rows of the partitions it dropped (PostgreSQL's estimates). It sets e's
// Created and Dropped.
func (s *Store) cleanupPartitioned(ctx context.Context, e *Event) (deleted int64, skipped bool, err error) {
	e.Created, e.Dropped = []PartitionSpan{}, []PartitionSpan{}
	created, err := s.createPartitions(ctx, 0)
	e.Created = append(e.Created, created...)
	// Starved creation, like starved sealing, is reported once the rest is
	// done.
	var starved error
	if errors.Is(err, ErrCleanupStarved) {
		starved, err = err, nil
	}
	if err != nil {
		return 0, false, err
	}
	st, err := s.readPartitions(ctx)
	if err != nil {
		return 0, false, err
	}
	sealedBefore, waiting, err := s.sealPartitions(ctx, st)
	// Starved sealing is reported once the rest is done.
	if errors.Is(err, ErrCleanupStarved) {
		starved, err = errors.Join(starved, err), nil
	}
	if err != nil {
		return 0, false, err
	}
	dropped, deleted, err := s.dropOrphans(ctx, st)
	if err == nil {
		var more []PartitionSpan
		var rows int64
		more, rows, err = s.dropPartitions(ctx, st)
		dropped, deleted = append(dropped, more...), deleted+rows
	}
	e.Dropped = append(e.Dropped, dropped...)
	s.log.InfoContext(ctx, "pgdedup: partitions", "table", s.messages.table, "created", spanNames(created),
		"sealed_before", sealedBefore.UTC(), "seal_waits_for", waiting, "dropped", spanNames(dropped), "rows_dropped", deleted)
	return deleted, false, errors.Join(err, starved)
}

// spanNames are the names of ps, for logs.
func spanNames(ps []PartitionSpan) []string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return names
}

// partitionName is the name of the partition starting at from: the parent's
// name and from in UTC, so that names sort by time. A parent's name longer
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

// shortPrefix is the parent's name as partition names begin with it: the
// name itself up to 30 bytes, else its first 21 bytes, "_" and the first 8
// hex digits of the SHA-256 of the name (30 bytes).
func shortPrefix(parent string) string {
	if len(parent) <= 30 {
		return parent
	}
	sum := sha256.Sum256([]byte(parent))
	return parent[:21] + "_" + hex.EncodeToString(sum[:4])
}

// partitionNameV1 is the name releases before the hash gave the partition
// starting at from (the parent's name cut to 30 bytes). Such partitions are
// found through pg_inherits and work as any; only the orphan check
// (partition_orphans.go) looks at their names.
func partitionNameV1(parent string, from time.Time) string {
	if len(parent) <= 30 {
		return partitionName(parent, from)
	}
	return parent[:30] + strings.TrimPrefix(partitionName(parent, from), shortPrefix(parent))
}

// createPartitions creates the partitions from the current one to
// partitionsAhead after it that are missing (and, given back, one covering
// back before the current one if none is older), each as a table of its own with
// its unique index on key and index on expires_at, then attached, each in a
// transaction of its own. It returns the partitions it created, oldest
// first, and an error wrapping ErrCleanupStarved if a lock held some up.
func (s *Store) createPartitions(ctx context.Context, back time.Duration) ([]PartitionSpan, error) {
	// Creating partitions can take longer than a span (distributed DDL on a
	// loaded Citus cluster). So once a round has created some, the next
	// counts the partitions ahead again from the current one, until a round
	// creates none.
	var all []PartitionSpan
	for round := 0; round < 4; round++ {
		made, err := s.createPartitionsOnce(ctx, back)
		all = append(all, made...)
		if err != nil || len(made) == 0 {
			return all, err
		}
		back = 0
	}
	return all, nil
}

// createPartitionsOnce is one round of createPartitions.
func (s *Store) createPartitionsOnce(ctx context.Context, back time.Duration) ([]PartitionSpan, error) {
	st, err := s.readPartitions(ctx)
	if err != nil {
		return nil, err
	}
	// A partition may span several spans (the legacy partition of a moved
	// table, partition_move.go): nothing may overlap it.
	covered := func(from time.Time) bool {
		return slices.ContainsFunc(st.parts, func(p partitionInfo) bool { return !from.Before(p.from) && from.Before(p.to) })
	}
	var created []PartitionSpan
	// One partition for the past (back, in whole spans), when there is none:
	// for IDs imported with their times. Sealed from the start.
	if back > 0 && (len(st.parts) == 0 || !st.parts[0].from.Before(st.current)) {
		from := st.current.Add(-(back + st.span - 1) / st.span * st.span)
		created = append(created, PartitionSpan{Name: partitionName(st.name, from), From: from.UTC(), To: st.current.UTC()})
	}
	for k := range partitionsAhead + 1 {
		from := st.current.Add(time.Duration(k) * st.span)
		if !covered(from) {
			created = append(created, PartitionSpan{Name: partitionName(st.name, from), From: from.UTC(), To: from.Add(st.span).UTC()})
		}
	}
	if len(created) == 0 {
		return nil, nil
	}
	// Each partition in a transaction of its own, which needs no turn:
	// concurrent cleaners may create the same one, and the losers find the
	// winner's (createPartition).
	made := created[:0]
	var blocked []string
	for i, p := range created {
		mine, err := s.createPartition(ctx, st, p)
		switch {
		case isCode(err, "55P03") && s.cleanerCreating(ctx):
			// Another cleaner holds the lock to create partitions: it
			// creates the rest (and reports it if it is held up itself).
			return made, nil
		case isCode(err, "55P03"):
			// The rest would wait for the same lock.
			for _, q := range created[i:] {
				blocked = append(blocked, q.Name)
			}
		case err != nil:
			return made, fmt.Errorf("pgdedup: create partition %s of %s: %w", p.Name, s.messages.table, withDetail(err))
		case mine:
			made = append(made, p)
		}
		if len(blocked) > 0 {
			break
		}
	}
	if len(blocked) > 0 {
		return made, s.creationStarved(ctx, st, made, blocked)
	}
	return made, nil
}

// createLockTimeout bounds creation's wait for its lock on the parent: a
// second longer than another cleaner's detach may hold it (detachWait), so
// that only a session holding it longer makes Cleanup starved. Claims do not
// wait behind it (SHARE UPDATE EXCLUSIVE).
func (s *Store) createLockTimeout() time.Duration {
	return cmp.Or(s.waits.detach, defaultDetachWait) + time.Second
}

// partitionCreatedSetting is set, until the transaction that created a
// partition ends, to say that it did.
const partitionCreatedSetting = "pgdedup.partition_created"

// createPartition creates partition p in a transaction of its own (see
// createPartitionSQL) and reports whether this call created it (false: it
// was there, checked). It tries again when another session created the
// same name at the same time (duplicate errors), or on a deadlock.
func (s *Store) createPartition(ctx context.Context, st *partitionState, p PartitionSpan) (mine bool, err error) {
	for try := 0; ; try++ {
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		b.Queue(fmt.Sprintf(`SELECT pg_catalog.set_config('lock_timeout', '%dms', true)`, s.createLockTimeout().Milliseconds()))
		b.Queue(createPartitionSQL(s.messages.table, st, p.Name, p.From, p.To))
		b.Queue(`SELECT coalesce(pg_catalog.current_setting('` + partitionCreatedSetting + `', true), '') = 'true'`).QueryRow(func(row pgx.Row) error {
			return row.Scan(&mine)
		})
		b.Queue(`COMMIT`)
		err = s.db.SendBatch(ctx, b).Close()
		if try >= 3 || !(isCode(err, "42P07") || isCode(err, "23505") || isCode(err, "42710") || isCode(err, "40P01")) {
			return mine && err == nil, err
		}
	}
}

// createPartitionSQL creates partition name, from ≤ processed_at < to, of
// parent (quoted), unless the table has a partition of that name already,
// which it checks (checkPartitionSQL). Otherwise each name it takes must be
// free (refuseTakenSQL), and it creates the table, its unique index on key,
// its index on expires_at, and attaches it (SHARE UPDATE EXCLUSIVE on the
// parent: claims go on), in the caller's transaction. It takes that lock
// first, so that cleaners racing for a partition take turns (only roles
// that may change the table's rows can take it), and the cleaners'
// advisory lock if it is free, only so that sealing does not wait for it
// (waitLockers): whoever holds that does not hold creation up.
func createPartitionSQL(parent string, st *partitionState, name string, from, to time.Time) string {
	q := st.quoted(name)
	// Citus wants the distribution column in every unique index.
	unique, columns := "key", []string{"key"}
	if st.distributed != "" && st.distributed != "key" {
		unique += ", " + pgx.Identifier{st.distributed}.Sanitize()
		columns = append(columns, st.distributed)
	}
	t := `'` + parent + `'::pg_catalog.regclass::pg_catalog.oid`
	bound := func(t time.Time) string { return `'` + t.UTC().Format(time.RFC3339Nano) + `'` }
	lock := `LOCK TABLE ONLY ` + parent + ` IN SHARE UPDATE EXCLUSIVE MODE`
	if st.distributed != "" {
		// On the coordinator only, where cleaners run: Citus's LOCK TABLE
		// locks every shard of every partition on every node (a third of a
		// second per partition created). It checks the same privileges.
		lock = `PERFORM pg_catalog.lock_relation_if_exists(` + quoteLiteral(parent) + `, 'SHARE UPDATE EXCLUSIVE')`
	}
	return `DO $pgdedup$
DECLARE
    r record;
BEGIN
    -- The lock ATTACH takes, taken first: concurrent cleaners create one
    -- partition at a time, and the next one finds it attached. Claims take
    -- ROW EXCLUSIVE, which it does not conflict with.
    ` + lock + `;
    PERFORM pg_catalog.pg_try_advisory_xact_lock(` + cleanupLockClass + `, ` + t + `::pg_catalog.int4);
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

// exec runs one statement and discards its rows.
func (s *Store) exec(ctx context.Context, sql string, args ...any) error {
	rows, err := s.db.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// sealPartitions seals every partition before the current one: it lists the
// transactions holding a lock on the table now (after the current partition
// began: st.current was read before), waits up to sealWait for all of them to
// end, and then moves sealed to the current partition's start. Any claim that
// chose an older partition as its current one read the clock while holding
// its lock on the table, so it was listed, or had ended before the list was
// taken. It returns where sealed stands, and how many listed transactions
// were still open if it gave up; err wraps ErrCleanupStarved if sealing is
// held up for too long (partition_starved.go).
func (s *Store) sealPartitions(ctx context.Context, st *partitionState) (sealed time.Time, waiting int, err error) {
	if !st.sealed.Before(st.current) {
		return st.sealed, 0, nil
	}
	wait := cmp.Or(s.waits.seal, boundedWait(defaultSealWait, st.span))
	deadline := time.Now().Add(wait)
	open, err := s.waitLockers(ctx, wait)
	var prepared []string // Citus: see partition_prepared.go
	if err == nil && len(open) == 0 && st.distributed != "" {
		prepared, err = s.waitPrepared(ctx, st, max(time.Until(deadline), 0))
	}
	if waiting = len(open) + len(prepared); err != nil || waiting > 0 {
		if err == nil {
			s.log.InfoContext(ctx, "pgdedup: sealing waits for transactions", "table", s.messages.table, "open", waiting)
			err = s.sealStarved(ctx, st, open, prepared)
		}
		return st.sealed, waiting, err
	}
	err = s.exec(ctx, `UPDATE `+s.partitionMeta+` SET sealed = $1
WHERE parent = '`+s.messages.table+`'::pg_catalog.regclass AND sealed < $1`, st.current)
	if err != nil {
		return st.sealed, 0, fmt.Errorf("pgdedup: seal partitions of %s: %w", s.messages.table, withDetail(err))
	}
	st.sealed = st.current
	return st.sealed, 0, nil
}

// waitLockers lists the transactions holding a lock on the table now and
// waits up to d for all of them to end, polling pg_locks (it holds no lock
// itself). It returns those still open when it gave up (virtualtransaction).
func (s *Store) waitLockers(ctx context.Context, d time.Duration) (open []string, err error) {
	// A lock on the table in a mode claims take, or a claim's advisory lock on
	// Citus (see partitionClaimLockClass); not a cleaner creating partitions
	// (it holds the cleaners' advisory lock when it is free, as a mark: see
	// createPartitionSQL), which on Citus takes long enough to hold sealing
	// up.
	oid := `'` + s.messages.table + `'::pg_catalog.regclass::pg_catalog.oid`
	from := `FROM pg_catalog.pg_locks WHERE database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
AND virtualtransaction NOT IN (SELECT virtualtransaction FROM pg_catalog.pg_locks WHERE locktype = 'advisory'
AND classid = ` + cleanupLockClass + `::pg_catalog.oid AND objid = ` + oid + ` AND objsubid = 2 AND mode = 'ExclusiveLock')
AND (locktype = 'relation' AND relation = ` + oid + `
AND mode IN ('AccessShareLock', 'RowShareLock', 'RowExclusiveLock')
OR locktype = 'advisory' AND classid = ` + partitionClaimLockClass + `::pg_catalog.oid
AND objid = ` + oid + ` AND objsubid = 2)`
	var listed []string
	if err := s.db.QueryRow(ctx, `SELECT coalesce(pg_catalog.array_agg(DISTINCT virtualtransaction), '{}') `+from+
		` AND pid IS DISTINCT FROM pg_catalog.pg_backend_pid()`).Scan(&listed); err != nil {
		return nil, fmt.Errorf("pgdedup: partitions of %s: list transactions: %w", s.messages.table, withDetail(err))
	}
	deadline := time.Now().Add(d)
	for pause := time.Millisecond; len(listed) > 0; pause = min(2*pause, 100*time.Millisecond) {
		if err := s.db.QueryRow(ctx, `SELECT coalesce(pg_catalog.array_agg(DISTINCT virtualtransaction), '{}') `+from+
			` AND virtualtransaction = ANY ($1::text[])`, listed).Scan(&listed); err != nil {
			return nil, fmt.Errorf("pgdedup: partitions of %s: wait for transactions: %w", s.messages.table, withDetail(err))
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
// One that still holds a live row is skipped, not waited for: its live rows
// are carried forward first, or it is kept (carryLive). A partition left
// pending by an interrupted detach is finalized first (PostgreSQL lets one
// partition of a table be pending detach at a time). A detach that waits
// longer than detachWait for old transactions is cancelled and left to the
// next run. It returns the partitions it dropped and their rows
// (PostgreSQL's estimates).
func (s *Store) dropPartitions(ctx context.Context, st *partitionState) (dropped []PartitionSpan, rows int64, err error) {
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
		// Sealed, and a Retention (this Store's) past its end: before that
		// it may hold IDs imported with their times, or rows to come.
		if p.to.After(st.sealed) || p.to.Add(s.cfg.Retention).After(st.current) {
			break
		}
		if !p.pending {
			if keep, err := s.carryLive(ctx, st, &p); err != nil {
				return dropped, rows, err
			} else if keep {
				continue
			}
		}
		mine, done, err := s.detachPartition(ctx, st, p)
		if err != nil || done {
			return dropped, rows, err
		}
		if s.waits.detached != nil && mine {
			s.waits.detached(p.name)
		}
		if err := s.dropDetached(ctx, st, p); err != nil {
			return dropped, rows, err
		}
		if mine {
			dropped = append(dropped, PartitionSpan{Name: p.name, From: p.from.UTC(), To: p.to.UTC()})
			rows += p.rows
		}
	}
	return dropped, rows, nil
}

// detachPartition detaches p: DETACH … CONCURRENTLY, or FINALIZE if p is
// pending. mine: this run detached it (not another cleaner). done: this run
// goes no further (a live row in p, old transactions still open, or the
// detach cut short), which err says only if it is an error.
func (s *Store) detachPartition(ctx context.Context, st *partitionState, p partitionInfo) (mine, done bool, err error) {
	q := st.quoted(p.name)
	wait := cmp.Or(s.waits.detach, boundedWait(defaultDetachWait, st.span))
	detach := `ALTER TABLE ` + s.messages.table + ` DETACH PARTITION ` + q + ` FINALIZE`
	if p.pending {
		// FINALIZE locks the partition before it waits for the transactions
		// that may still read it, which then deadlock with it: let them end
		// first. Later ones never see the partition.
		open, err := s.waitLockers(ctx, wait)
		if err != nil || len(open) > 0 {
			s.log.InfoContext(ctx, "pgdedup: detach waits for transactions", "partition", p.name, "open", len(open))
			return false, true, err
		}
	} else {
		var live bool
		if err := s.db.QueryRow(ctx, liveSQL(st, s.messages.table, p)).Scan(&live); err != nil {
			return false, true, fmt.Errorf("pgdedup: drop partition %s: %w", p.name, withDetail(err))
		}
		if live {
			return false, true, nil
		}
		detach = `ALTER TABLE ` + s.messages.table + ` DETACH PARTITION ` + q + ` CONCURRENTLY`
	}
	// Marked first, so that a run stopped before its DROP TABLE leaves a
	// table the next one recognizes (partition_orphans.go).
	err = s.markDetach(ctx, st, p)
	switch {
	case err != nil:
	case st.distributed != "":
		err = s.detachCitus(ctx, st, p)
	default:
		err = s.execAlone(ctx, wait, detach)
	}
	switch code, _ := sqlState(err); {
	case err == nil:
		return true, false, nil
	case code == "42P01":
		return false, false, nil // another cleaner detached it (and drops it, as this one does)
	case code == "57014" || code == "55P03" || code == "55000" || code == "40P01":
		// Cancelled after the detach wait, the lock wait over, or another
		// cleaner's detach pending: the next run goes on.
		s.log.InfoContext(ctx, "pgdedup: detach left to the next cleanup", "partition", p.name, "error", err)
		return false, true, ctx.Err()
	default:
		return false, true, fmt.Errorf("pgdedup: detach partition %s: %w", p.name, withDetail(err))
	}
}

// citusDetachLockTimeout bounds how long a DETACH on Citus waits for each
// lock it takes; claims queue behind it meanwhile.
const citusDetachLockTimeout = 500 * time.Millisecond

// detachCitus detaches p from a table Citus distributes, which refuses
// DETACH … CONCURRENTLY: a plain DETACH, which takes ACCESS EXCLUSIVE on the
// parent, on the coordinator and then on the workers' shards. Every lock it
// waits for is bounded by citusDetachLockTimeout (SET LOCAL, which Citus
// passes on to the workers), so a claim waits at most that long per node
// behind it, plus the detach itself (catalog changes only). Given up, the
// next run tries again.
func (s *Store) detachCitus(ctx context.Context, st *partitionState, p partitionInfo) error {
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`SELECT pg_catalog.set_config('citus.propagate_set_commands', 'local', true)`)
	b.Queue(fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, citusDetachLockTimeout.Milliseconds()))
	b.Queue(`ALTER TABLE ` + s.messages.table + ` DETACH PARTITION ` + st.quoted(p.name))
	b.Queue(`COMMIT`)
	return s.db.SendBatch(ctx, b).Close()
}

// dropDetached drops p once detached, waiting for its lock at most 2s.
func (s *Store) dropDetached(ctx context.Context, st *partitionState, p partitionInfo) error {
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`SELECT pg_catalog.set_config('lock_timeout', '2s', true)`)
	b.Queue(`DROP TABLE IF EXISTS ` + st.quoted(p.name))
	b.Queue(`COMMIT`)
	if err := s.db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("pgdedup: drop detached partition %s: %w", p.name, withDetail(err))
	}
	return nil
}

// execAlone runs sql as a statement of its own (DETACH … CONCURRENTLY may
// not run in a transaction block) and cancels it on the server after d. On
// a pool the connection used is closed if the cancel was sent, so that a
// late cancel cannot hit the next statement.
func (s *Store) execAlone(ctx context.Context, d time.Duration, sql string) error {
	var conn *pgx.Conn
	switch db := s.db.(type) {
	case *pgxpool.Pool:
		c, err := db.Acquire(ctx)
		if err != nil {
			return err
		}
		defer c.Release()
		conn = c.Conn()
	case *pgx.Conn:
		conn = db
	default:
		tctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		rows, err := s.db.Query(tctx, sql)
		if err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
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
		if _, pooled := s.db.(*pgxpool.Pool); pooled {
			_ = conn.Close(context.WithoutCancel(ctx))
		}
	}
	return err
}

// partitionedSizes fills in st's sizes, dead tuples and partitions from the
// partitions (the parent itself stores nothing).
func (s *Store) partitionedSizes(ctx context.Context, stats *Stats) error {
	st, err := s.readPartitions(ctx)
	if err != nil {
		return err
	}
	counts := map[uint32]int64{}
	var oid uint32
	var n int64
	if st.distributed == "" {
		rows, _ := s.db.Query(ctx, `SELECT tableoid, count(*) FROM `+s.messages.table+` GROUP BY 1`)
		if _, err := pgx.ForEachRow(rows, []any{&oid, &n}, func() error { counts[oid] = n; return nil }); err != nil {
			return fmt.Errorf("pgdedup: stats of %s: count rows per partition: %w", s.messages.table, withDetail(err))
		}
	}
	stats.PartitionSpan = st.span
	stats.SealedBefore = ptr(st.sealed.UTC())
	stats.Partitions = []PartitionStats{}
	for _, p := range st.parts {
		q := st.quoted(p.name)
		ps := PartitionStats{Name: p.name, From: p.from.UTC(), To: p.to.UTC(), Sealed: !p.to.After(st.sealed), Detaching: p.pending}
		var tb, ib, dead int64
		sizes := `SELECT pg_catalog.pg_table_size(r), pg_catalog.pg_indexes_size(r),
coalesce((SELECT n_dead_tup FROM pg_catalog.pg_stat_user_tables WHERE relid = r), 0)
FROM pg_catalog.to_regclass($1::text) r`
		if st.distributed != "" {
			// Citus: the shards' sizes and rows (a shard's tableoid is the
			// worker's); dead tuples are the workers'.
			sizes = `SELECT citus_table_size(r), citus_total_relation_size(r) - citus_table_size(r), 0::bigint
FROM pg_catalog.to_regclass($1::text) r`
			if err := s.db.QueryRow(ctx, `SELECT count(*) FROM `+q).Scan(&n); err != nil {
				return fmt.Errorf("pgdedup: stats of %s: partition %s: %w", s.messages.table, p.name, withDetail(err))
			}
			counts[p.oid] = n
		}
		err := s.db.QueryRow(ctx, sizes, q).Scan(&tb, &ib, &dead)
		if err != nil {
			return fmt.Errorf("pgdedup: stats of %s: partition %s: %w", s.messages.table, p.name, withDetail(err))
		}
		ps.Bytes = tb + ib
		stats.TableBytes += tb
		stats.IndexBytes += ib
		stats.TotalBytes += tb + ib
		stats.DeadTuples += dead
		ps.Rows = counts[p.oid]
		stats.Partitions = append(stats.Partitions, ps)
	}
	stats.PartitionRunway = ptr(runwayLeft(stats.Partitions, stats.Now))
	return nil
}

// runwayLeft is how long after now claims find a partition if no cleanup
// runs: to the end of the unbroken run of attached partitions that holds
// now (a partition being detached takes no claims). Zero when none holds it.
func runwayLeft(parts []PartitionStats, now time.Time) time.Duration {
	at := now
	for {
		i := slices.IndexFunc(parts, func(p PartitionStats) bool { return !p.Detaching && !at.Before(p.From) && at.Before(p.To) })
		if i < 0 {
			return at.Sub(now)
		}
		at = parts[i].To
	}
}

func ptr[T any](v T) *T { return &v }

func (l partitionedLayout) cleanup(ctx context.Context, s *Store, e *Event) (int64, bool, error) {
	return s.cleanupPartitioned(ctx, e)
}

func (l partitionedLayout) sizes(ctx context.Context, s *Store, st *Stats) error {
	return s.partitionedSizes(ctx, st)
}
