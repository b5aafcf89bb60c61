package pgdedup

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file is the one seam for where the tables live. What differs between a
// table on one PostgreSQL server and one that Citus distributes (the
// statements around a claim, the batch statement, cleanup, sizes) is chosen
// once per Store, on first use, and each backend's code lives in its own
// files: plain PostgreSQL below and in cleanup.go, Citus in the citus*.go
// files. A new shape of processed_messages (time partitions, say) is one more
// layout.

// placement is where a table lives: what a claim of any kind needs to know.
type placement interface {
	// settings returns the transaction-local settings a claim runs with:
	// Config.LockTimeout, and for a batch whatever keeps overlapping batches
	// from deadlocking.
	settings(batch bool) txSettings
	// transient marks err, a failure of the database, as one a new
	// transaction can cure where this placement knows more than IsTransient;
	// other errors are returned as they are.
	transient(err error) error
}

// layout is how processed_messages is shaped and where it lives: the
// statements that claim IDs in it, how it is cleaned up and how big it is.
type layout interface {
	placement
	// claimOne returns the statements claiming c's ID, with c's options; they
	// set c.claimed, and read what c needs of the ID's row.
	claimOne(c *idClaim) []statement
	// storeResult returns the statement storing result in the row c claimed.
	storeResult(c *idClaim, result []byte) statement
	// claimMany returns the statements claiming c's sorted IDs; they add the
	// new ones to c.fresh.
	claimMany(c *batchClaim) []statement
	// lookup returns the statement reading the row of r's ID; it fills in r.
	lookup(r *lookupRow) statement
	// forget returns the statements deleting the row of c's ID once any
	// transaction holding it has ended; they set c.found.
	forget(c *forgetClaim) []statement
	// cleanup deletes expired rows (see Store.Cleanup); skipped reports that
	// it never had the cleaners' turn, another cleaner holding it throughout.
	// e is the run's EventCleanup, to which it may add what else it did.
	cleanup(ctx context.Context, s *Store, e *Event) (deleted int64, skipped bool, err error)
	// sizes fills in st's sizes, and what else the layout can say of the
	// table's storage.
	sizes(ctx context.Context, s *Store, st *Stats) error
}

// layouts are the layouts of a Store's two tables, looked up on first use
// (see Store.layouts).
type layouts struct {
	messages layout    // Config.Table
	offsets  placement // Config.OffsetTable
	at       time.Time // when they were looked up
}

// stale reports whether ls are due to be looked up again: a plain table
// every defaultLayoutRecheck, so that a Store follows a move to the partitioned
// layout (Setup on a populated table) before its switch time.
func (s *Store) stale(ls *layouts) bool {
	_, plain := ls.messages.(plainLayout)
	return plain && s.move.recheck >= 0 && time.Since(ls.at) >= cmp.Or(s.move.recheck, defaultLayoutRecheck)
}

// transient marks err as transient if either table's placement says so.
func (ls *layouts) transient(err error) error {
	return ls.offsets.transient(ls.messages.transient(err))
}

// The look-up, without referencing Citus's catalog (absent on plain
// PostgreSQL) in the first statement. In a transaction whose snapshot
// predates a move the table is still plain, and the plain statement is what
// works there (the partitioned claim would not see its pgdedup_partitions
// row): exact until the switch, which comes minutes later.
const (
	layoutQuery = `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL, to_regclass($1) IS NOT NULL,
coalesce((SELECT relkind = 'p' FROM pg_catalog.pg_class WHERE oid = to_regclass($1)), false)`
	citusLayoutQuery = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1)),
EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($2))`
)

// layouts returns the layouts of the Store's tables, looking them up with
// query on first use: one query on plain PostgreSQL, two where Citus is
// installed, once per Store, and again every defaultLayoutRecheck while the table
// is plain (see stale). Config.Layout plays no part: a partitioned table
// (relkind p) has the partitioned layout, and a plain one the plain layout,
// so a Partitioned Store rolled out before Setup claims exactly on the plain
// table and follows the move. A missing table is not remembered: the claim
// that follows reports it. A table distributed after the Store's first use
// keeps its plain layout until the next look-up: distribute before starting
// consumers.
func (s *Store) layouts(ctx context.Context, query queryRowFunc) (*layouts, error) {
	if ls := s.found.Load(); ls != nil && !s.stale(ls) {
		return ls, nil
	}
	var citusInstalled, exists, partitioned, messagesOnCitus, offsetsOnCitus bool
	if err := query(ctx, layoutQuery, []any{s.messages.table}, &citusInstalled, &exists, &partitioned); err != nil {
		return nil, fromDatabase(fmt.Errorf("pgdedup: look up %s: %w", s.messages.table, withDetail(err)))
	}
	if citusInstalled {
		if err := query(ctx, citusLayoutQuery, []any{s.messages.table, s.offsets.table}, &messagesOnCitus, &offsetsOnCitus); err != nil {
			return nil, fromDatabase(fmt.Errorf("pgdedup: look up %s in pg_dist_partition: %w", s.messages.table, withDetail(err)))
		}
	}
	ls := &layouts{messages: plainLayout{plainPlacement(s.messages.lockTimeoutMS)}, offsets: plainPlacement(s.messages.lockTimeoutMS), at: time.Now()}
	switch {
	case messagesOnCitus && partitioned:
		ls.messages = newCitusPartitionedLayout(s.messages, s.partitionMeta, s.partitionFunc)
	case messagesOnCitus:
		ls.messages = newCitusLayout(s.messages)
	case partitioned:
		ls.messages = newPartitionedLayout(s.messages, s.partitionMeta)
	}
	if offsetsOnCitus {
		ls.offsets = citusPlacement(s.messages.lockTimeoutMS)
	}
	if exists {
		s.found.Store(ls)
	}
	return ls, nil
}

// messageStatements are a Store's SQL for processed_messages, built once in
// New. The table name is quoted; the retention and lock timeout are integers
// formatted by us; the consumer and the IDs are always bound parameters.
type messageStatements struct {
	table   string // quoted, possibly schema-qualified
	expires string // the expires_at expression
	claim   string // $1 consumer, $2 id, $3 key
	// claimWith are the claims with options, by claimVariant: claimWith[0]
	// is claim; the others add $4 the retention in microseconds and/or the
	// fingerprint, last.
	claimWith         [4]string
	storedFingerprint string // $1 consumer, $2 id, $3 key
	storedResult      string // $1 consumer, $2 id, $3 key
	storeResult       string // $1 consumer, $2 id, $3 key, $4 result
	claimBatch        string // $1 consumer, $2 ids, $3 their keys, sorted by key
	lookup            string // $1 consumer, $2 id, $3 key
	forget            string // $1 consumer, $2 id, $3 key
	lockTimeoutMS     int64  // Config.LockTimeout in milliseconds, rounded up; 0 for none
}

func newMessageStatements(table pgx.Identifier, retention, lockTimeout time.Duration) messageStatements {
	t := table.Sanitize()
	expires := fmt.Sprintf("now() + interval '%d microseconds'", retention.Microseconds())
	where := ` WHERE key = $3::uuid AND consumer = $1 AND message_id = $2`
	m := messageStatements{
		table:   t,
		expires: expires,
		claim: `INSERT INTO ` + t + ` (key, consumer, message_id, expires_at) VALUES ($3::uuid, $1, $2, ` + expires + `)
ON CONFLICT DO NOTHING`,
		claimBatch: `INSERT INTO ` + t + ` (key, consumer, message_id, expires_at)
SELECT k, $1, id, ` + expires + ` FROM unnest($3::uuid[], $2::text[]) WITH ORDINALITY AS u(k, id, n) ORDER BY n
ON CONFLICT DO NOTHING
RETURNING message_id`,
		// Every column of the key in the WHERE clause: Citus routes the
		// statement to one shard whichever column distributes the table.
		lookup:        `SELECT processed_at, expires_at FROM ` + t + ` WHERE key = $3::uuid AND consumer = $1 AND message_id = $2`,
		forget:        `DELETE FROM ` + t + ` WHERE key = $3::uuid AND consumer = $1 AND message_id = $2`,
		lockTimeoutMS: int64((lockTimeout + time.Millisecond - 1) / time.Millisecond),
		// A row is the ID's record until it is deleted, expired or not.
		storedFingerprint: `SELECT fingerprint FROM ` + t + where,
		storedResult:      `SELECT fingerprint, result FROM ` + t + where,
		storeResult:       `UPDATE ` + t + ` SET result = $4` + where,
	}
	m.claimWith[0] = m.claim
	for v := 1; v < len(m.claimWith); v++ {
		cols, values, n := "", "", 4
		exp := expires
		if v&claimRetention != 0 {
			exp = fmt.Sprintf("now() + $%d::bigint * interval '1 microsecond'", n)
			n++
		}
		if v&claimFingerprint != 0 {
			cols, values = ", fingerprint", fmt.Sprintf(", $%d::bytea", n)
		}
		m.claimWith[v] = `INSERT INTO ` + t + ` (key, consumer, message_id, expires_at` + cols + `) VALUES ($3::uuid, $1, $2, ` + exp + values + `)
ON CONFLICT DO NOTHING`
	}
	return m
}

// The bits of a claim's variant: which options change its statement.
const (
	claimRetention   = 1 // WithRetention: expires_at from $4
	claimFingerprint = 2 // WithFingerprint: the fingerprint column
)

// plainPlacement is a table on one PostgreSQL server; its value is
// Config.LockTimeout in milliseconds (0: none).
type plainPlacement int64

// settings: with Config.LockTimeout, the claim runs between saving the
// caller's lock_timeout and setting ours, and restoring it, so the wait is
// bounded without changing lock_timeout for the rest of the transaction. All
// are transaction-local (set_config's is_local).
func (ms plainPlacement) settings(bool) txSettings {
	if ms == 0 {
		return txSettings{}
	}
	return txSettings{
		set: []string{
			`SELECT set_config('pgdedup.lock_timeout', current_setting('lock_timeout'), true)`,
			fmt.Sprintf(`SELECT set_config('lock_timeout', '%dms', true)`, int64(ms)),
		},
		restore: []string{`SELECT set_config('lock_timeout', current_setting('pgdedup.lock_timeout'), true)`},
	}
}

func (plainPlacement) transient(err error) error { return err }

// plainLayout is processed_messages as migrations 00001-00003 create it, on
// one PostgreSQL server: one table, one unique index on key.
type plainLayout struct{ plainPlacement }

// claimOne is one INSERT … ON CONFLICT DO NOTHING, the same statement for
// every call without options. With a fingerprint, or for a stored result, a
// SELECT follows: a statement of its own, so that its snapshot is taken after
// the INSERT waited for a transaction holding the ID, and sees its row.
func (plainLayout) claimOne(c *idClaim) []statement {
	return claimOneWith(c, c.store.messages.claimWith)
}

// claimOneWith is a layout's claimOne, given its claims by claimVariant
// (claimWith[0] is the claim without options), followed by the SELECT of a
// fingerprint or a stored result.
func claimOneWith(c *idClaim, claimWith [4]string) []statement {
	s := c.store
	args := []any{s.cfg.Consumer, c.id, Key(s.cfg.Consumer, c.id)}
	variant, claimArgs := 0, args
	if c.opts.retention != 0 {
		variant |= claimRetention
		claimArgs = append(claimArgs[:len(claimArgs):len(claimArgs)], c.opts.retention.Microseconds())
	}
	if c.opts.fingerprint != nil {
		variant |= claimFingerprint
		claimArgs = append(claimArgs[:len(claimArgs):len(claimArgs)], c.opts.fingerprint)
	}
	sts := []statement{{sql: claimWith[variant], args: claimArgs, affected: func(n int64) { c.claimed = n == 1 }}}
	switch {
	case c.withResult:
		sts = append(sts, statement{sql: s.messages.storedResult, args: args, row: c.scanStored})
	case c.opts.fingerprint != nil:
		sts = append(sts, statement{sql: s.messages.storedFingerprint, args: args, row: c.scanStored})
	}
	return sts
}

func (plainLayout) storeResult(c *idClaim, result []byte) statement {
	s := c.store
	return statement{sql: s.messages.storeResult, args: []any{s.cfg.Consumer, c.id, Key(s.cfg.Consumer, c.id), result}}
}

// claimMany is one INSERT … SELECT FROM unnest, whatever the batch size.
func (plainLayout) claimMany(c *batchClaim) []statement {
	s := c.store
	return []statement{{sql: s.messages.claimBatch, args: []any{s.cfg.Consumer, c.sorted.ids, c.sorted.keys}, row: c.addFresh}}
}

func (plainLayout) lookup(r *lookupRow) statement {
	s := r.store
	return statement{sql: s.messages.lookup, args: []any{s.cfg.Consumer, r.id, Key(s.cfg.Consumer, r.id)}, row: r.scan}
}

func (l plainLayout) forget(c *forgetClaim) []statement { return forgetStatements(l, c) }

// forgetStatements are the statements of a Forget on any layout. First the
// layout's own claim of the ID: it waits for a transaction that holds the ID
// (a first delivery in flight) to end, or gives up after Config.LockTimeout,
// exactly as a claim would. A plain DELETE would not see that transaction's
// uncommitted row, delete nothing, and let a redelivery run beside it. The
// DELETE, a statement of its own and so with a snapshot taken after the wait,
// then removes the ID's rows, committed or just claimed; there was a row only
// if the claim found the ID already claimed.
func forgetStatements(l layout, c *forgetClaim) []statement {
	s := c.store
	c.claim = idClaim{store: s, id: c.id}
	return append(l.claimOne(&c.claim), statement{
		sql: s.messages.forget, args: []any{s.cfg.Consumer, c.id, Key(s.cfg.Consumer, c.id)},
		affected: func(n int64) { c.found = n > 0 && !c.claim.claimed }})
}

func (plainLayout) cleanup(ctx context.Context, s *Store, _ *Event) (int64, bool, error) {
	return s.cleanupPlain(ctx)
}

func (plainLayout) sizes(ctx context.Context, s *Store, st *Stats) error {
	return s.plainSizes(ctx, st)
}
