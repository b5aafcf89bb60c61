package pgdedup

import (
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
	// claimOne returns the statement claiming c's ID; it sets c.claimed.
	claimOne(c *idClaim) statement
	// claimMany returns the statements claiming c's sorted IDs; they add the
	// new ones to c.fresh.
	claimMany(c *batchClaim) []statement
	// cleanup deletes expired rows (see Store.Cleanup); skipped reports that
	// it never had the cleaners' turn, another cleaner holding it throughout.
	cleanup(ctx context.Context, s *Store) (deleted int64, skipped bool, err error)
	// sizes fills in st's sizes, and what else the layout can say of the
	// table's storage.
	sizes(ctx context.Context, s *Store, st *Stats) error
}

// layouts are the layouts of a Store's two tables, looked up on first use
// (see Store.layouts).
type layouts struct {
	messages layout    // Config.Table
	offsets  placement // Config.OffsetTable
}

// transient marks err as transient if either table's placement says so.
func (ls *layouts) transient(err error) error {
	return ls.offsets.transient(ls.messages.transient(err))
}

// The look-up, without referencing Citus's catalog (absent on plain
// PostgreSQL) in the first statement.
const (
	layoutQuery = `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL, to_regclass($1) IS NOT NULL,
coalesce((SELECT relkind = 'p' FROM pg_catalog.pg_class WHERE oid = to_regclass($1)), false)`
	citusLayoutQuery = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1)),
EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($2))`
)

// layouts returns the layouts of the Store's tables, looking them up with
// query on first use: one query on plain PostgreSQL, two where Citus is
// installed, once per Store. A partitioned table (relkind p) has the
// partitioned layout whatever Config.Layout says. A missing table is not remembered: the claim
// that follows reports it. A table distributed after the Store's first use
// keeps its plain layout until the Store is recreated: distribute before
// starting consumers.
func (s *Store) layouts(ctx context.Context, query queryRowFunc) (*layouts, error) {
	if ls := s.found.Load(); ls != nil {
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
	ls := &layouts{messages: plainLayout{plainPlacement(s.messages.lockTimeoutMS)}, offsets: plainPlacement(s.messages.lockTimeoutMS)}
	switch {
	case messagesOnCitus && partitioned:
		return nil, fmt.Errorf("pgdedup: %s is partitioned and distributed by Citus: the Partitioned layout runs on plain PostgreSQL only", s.messages.table)
	case messagesOnCitus:
		ls.messages = newCitusLayout(s.messages)
	case partitioned:
		ls.messages = newPartitionedLayout(s.messages, s.partitionMeta)
	case exists && s.cfg.Layout == Partitioned:
		return nil, fmt.Errorf("pgdedup: Config.Layout is Partitioned but %s is a plain table: call Store.Setup once (as the table's owner) before claiming", s.messages.table)
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
	table         string // quoted, possibly schema-qualified
	expires       string // the expires_at expression
	claim         string // $1 consumer, $2 id, $3 key
	claimBatch    string // $1 consumer, $2 ids, $3 their keys, sorted by key
	lockTimeoutMS int64  // Config.LockTimeout in milliseconds, rounded up; 0 for none
}

func newMessageStatements(table pgx.Identifier, retention, lockTimeout time.Duration) messageStatements {
	t := table.Sanitize()
	expires := fmt.Sprintf("now() + interval '%d microseconds'", retention.Microseconds())
	return messageStatements{
		table:   t,
		expires: expires,
		claim: `INSERT INTO ` + t + ` (key, consumer, message_id, expires_at) VALUES ($3::uuid, $1, $2, ` + expires + `)
ON CONFLICT DO NOTHING`,
		claimBatch: `INSERT INTO ` + t + ` (key, consumer, message_id, expires_at)
SELECT k, $1, id, ` + expires + ` FROM unnest($3::uuid[], $2::text[]) WITH ORDINALITY AS u(k, id, n) ORDER BY n
ON CONFLICT DO NOTHING
RETURNING message_id`,
		lockTimeoutMS: int64((lockTimeout + time.Millisecond - 1) / time.Millisecond),
	}
}

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

func (plainLayout) claimOne(c *idClaim) statement {
	return statement{sql: c.store.messages.claim, args: []any{c.store.cfg.Consumer, c.id, Key(c.store.cfg.Consumer, c.id)},
		affected: func(n int64) { c.claimed = n == 1 }}
}

// claimMany is one INSERT … SELECT FROM unnest, whatever the batch size.
func (plainLayout) claimMany(c *batchClaim) []statement {
	s := c.store
	return []statement{{sql: s.messages.claimBatch, args: []any{s.cfg.Consumer, c.sorted.ids, c.sorted.keys}, row: c.addFresh}}
}

func (plainLayout) cleanup(ctx context.Context, s *Store) (int64, bool, error) {
	return s.cleanupPlain(ctx)
}

func (plainLayout) sizes(ctx context.Context, s *Store, st *Stats) error {
	return s.plainSizes(ctx, st)
}
