package pgdedup

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup/internal/placement/citus"
	"github.com/pgdedup/pgdedup/internal/shape"
	"github.com/pgdedup/pgdedup/internal/shape/partitioned"
	"github.com/pgdedup/pgdedup/internal/shape/plain"
)

// This file is the one place that chooses how the dedup table is shaped
// and where it lives. A shape is the plain table (internal/shape/plain) or
// the partitioned one (internal/shape/partitioned). A placement is one
// server or a Citus cluster (internal/placement/citus). The partitioned
// table on Citus is the partitioned shape with Citus's placement. The
// choice is made once per Store, on first use. The engine (engine.go) then
// asks the shape for each claim's statements, through the small adapter
// below. No other file of this package names Citus.

// placed is a table's placement, as the engine calls it.
type placed struct{ p shape.Placement }

// settings returns the transaction-local settings a claim runs with.
func (p placed) settings(batch bool) txSettings {
	st := p.p.Settings(batch)
	return txSettings{set: st.Set, restore: st.Restore}
}

// transient marks err as transient where the placement knows more than
// IsTransient.
func (p placed) transient(err error) error { return p.p.Transient(err) }

// shaped is the dedup table's shape, as the engine calls it.
type shaped struct {
	placed
	sh shape.Shape
}

func newShaped(sh shape.Shape) shaped { return shaped{placed{sh}, sh} }

// id is the ID of a claim, with its consumer and key.
func (s *Store) id(messageID string) shape.ID {
	return shape.ID{Consumer: s.cfg.Consumer, ID: messageID, Key: Key(s.cfg.Consumer, messageID)}
}

// claimOne returns the statements claiming c's ID, with c's options. They
// set c.claimed and read what c needs of the ID's row.
func (l shaped) claimOne(c *idClaim) []statement {
	return statements(l.sh.ClaimOne(shape.One{ID: c.store.id(c.id), Retention: c.opts.retention, Fingerprint: c.opts.fingerprint,
		WithResult: c.withResult, Claimed: &c.claimed, Stored: c.scanStored}))
}

// storeResult returns the statement storing result in the row c claimed.
func (l shaped) storeResult(c *idClaim, result []byte) statement {
	return statements([]shape.Statement{l.sh.StoreResult(c.store.id(c.id), result)})[0]
}

// claimMany returns the statements claiming c's sorted IDs. They add the
// new ones to c.fresh.
func (l shaped) claimMany(c *batchClaim) []statement {
	return statements(l.sh.ClaimMany(shape.Many{Consumer: c.store.cfg.Consumer, IDs: c.sorted.ids, Keys: c.sorted.keys, Fresh: c.addFresh}))
}

// lookup returns the statement reading the row of r's ID. It fills in r.
func (l shaped) lookup(r *lookupRow) statement {
	return statements([]shape.Statement{l.sh.Lookup(r.store.id(r.id), r.scan)})[0]
}

// forget returns the statements of a Forget. First comes the shape's own
// claim of the ID. It waits for a transaction that holds the ID (a first
// delivery in flight) to end, or gives up after Config.LockTimeout, exactly
// as a claim would. A plain DELETE would not see that transaction's
// uncommitted row. It would delete nothing and let a redelivery run beside
// it. The DELETE follows as a statement of its own, with a snapshot taken
// after the wait. It removes the ID's rows, committed or just claimed.
// There was a row only if the claim found the ID already claimed.
func (l shaped) forget(c *forgetClaim) []statement {
	c.claim = idClaim{store: c.store, id: c.id}
	del := l.sh.Delete(c.store.id(c.id), func(n int64) { c.found = n > 0 && !c.claim.claimed })
	return append(l.claimOne(&c.claim), statements([]shape.Statement{del})...)
}

// cleanup deletes expired rows (see Store.Cleanup). skipped reports that
// it never had the cleaners' turn. It adds the partitions it created and
// dropped to e.
func (l shaped) cleanup(ctx context.Context, e *Event) (deleted int64, skipped bool, err error) {
	var r shape.Report
	deleted, skipped, err = l.sh.Cleanup(ctx, &r)
	e.Created, e.Dropped = spans(r.Created), spans(r.Dropped)
	return deleted, skipped, err
}

func spans(in []shape.Span) []PartitionSpan {
	if in == nil {
		return nil
	}
	out := make([]PartitionSpan, len(in))
	for i, p := range in {
		out[i] = PartitionSpan(p)
	}
	return out
}

// sizes fills in st's sizes, and what else the shape can say of the
// table's storage.
func (l shaped) sizes(ctx context.Context, st *Stats) error {
	sz := shape.Sizes{Now: st.Now, TableBytes: st.TableBytes, IndexBytes: st.IndexBytes, TotalBytes: st.TotalBytes}
	err := l.sh.Sizes(ctx, &sz)
	st.TableBytes, st.IndexBytes, st.TotalBytes, st.DeadTuples = sz.TableBytes, sz.IndexBytes, sz.TotalBytes, sz.DeadTuples
	st.LastVacuum, st.LastAutovacuum = sz.LastVacuum, sz.LastAutovacuum
	st.PartitionSpan, st.SealedBefore, st.PartitionRunway = sz.PartitionSpan, sz.SealedBefore, sz.PartitionRunway
	if sz.Indexes != nil {
		st.Indexes = make([]IndexStats, len(sz.Indexes))
		for i, x := range sz.Indexes {
			st.Indexes[i] = IndexStats(x)
		}
	}
	if sz.Partitions != nil {
		st.Partitions = make([]PartitionStats, len(sz.Partitions))
		for i, p := range sz.Partitions {
			st.Partitions[i] = PartitionStats(p)
		}
	}
	return err
}

// statements are a shape's statements, as the engine sends them.
func statements(sts []shape.Statement) []statement {
	out := make([]statement, len(sts))
	for i, st := range sts {
		out[i] = statement{sql: st.SQL, args: st.Args, row: st.Row, affected: st.Affected}
	}
	return out
}

// layouts are the shapes of a Store's two tables, looked up on first use
// (see Store.layouts).
type layouts struct {
	messages shaped             // Config.Table
	offsets  placed             // Config.OffsetTable
	plain    bool               // messages is the plain table on one server
	part     *partitioned.Shape // messages, if partitioned
	at       time.Time          // when they were looked up
}

// stale reports whether ls are due to be looked up again. A plain table is
// looked up every DefaultLayoutRecheck. So a Store follows a move to the
// partitioned layout (Setup on a populated table) before its switch time.
func (s *Store) stale(ls *layouts) bool {
	return ls.plain && s.move.Recheck >= 0 && time.Since(ls.at) >= cmp.Or(s.move.Recheck, partitioned.DefaultLayoutRecheck)
}

// transient marks err as transient if either table's placement says so.
func (ls *layouts) transient(err error) error {
	return ls.offsets.transient(ls.messages.transient(err))
}

// The look-up does not reference Citus's catalog in the first statement,
// since it is absent on plain PostgreSQL. In a transaction whose snapshot
// predates a move, the table is still plain. The plain statement is what
// works there, because the partitioned claim would not see its
// pgdedup_partitions row. That is exact until the switch, which comes
// minutes later.
const (
	layoutQuery = `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL, to_regclass($1) IS NOT NULL,
coalesce((SELECT relkind = 'p' FROM pg_catalog.pg_class WHERE oid = to_regclass($1)), false)`
	citusLayoutQuery = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1)),
EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($2))`
)

// layouts returns the shapes of the Store's tables, looking them up with
// query on first use. That is one query on plain PostgreSQL and two where
// Citus is installed, once per Store. A plain table is looked up again every
// DefaultLayoutRecheck (see stale). Config.Layout plays no part. A
// partitioned table (relkind p) has the partitioned shape, and a plain one
// the plain shape. So a Partitioned Store rolled out before Setup claims
// exactly on the plain table and follows the move. A missing table is not
// remembered, and the claim that follows reports it. A table distributed
// after the Store's first use keeps its plain shape until the next
// look-up. So distribute before starting consumers.
func (s *Store) layouts(ctx context.Context, query queryRowFunc) (*layouts, error) {
	if ls := s.found.Load(); ls != nil && !s.stale(ls) {
		return ls, nil
	}
	var citusInstalled, exists, isPartitioned, messagesOnCitus, offsetsOnCitus bool
	if err := query(ctx, layoutQuery, []any{s.messages.table}, &citusInstalled, &exists, &isPartitioned); err != nil {
		return nil, fromDatabase(fmt.Errorf("pgdedup: look up %s: %w", s.messages.table, withDetail(err)))
	}
	if citusInstalled {
		if err := query(ctx, citusLayoutQuery, []any{s.messages.table, s.offsets.table}, &messagesOnCitus, &offsetsOnCitus); err != nil {
			return nil, fromDatabase(fmt.Errorf("pgdedup: look up %s in pg_dist_partition: %w", s.messages.table, withDetail(err)))
		}
	}
	ms := s.messages.lockTimeoutMS
	ls := &layouts{messages: newShaped(plain.New(s.env(), s.messages.sql)), offsets: placed{plain.Placement(ms)}, plain: true, at: time.Now()}
	switch {
	case messagesOnCitus && isPartitioned:
		ls.part = s.partitioned(citus.NewPartitioned(ms, s.partitionFunc))
	case messagesOnCitus:
		ls.messages, ls.plain = newShaped(citus.NewPlain(s.env(), s.messages.sql)), false
	case isPartitioned:
		ls.part = s.partitioned(partitioned.OneServer{Placement: plain.Placement(ms)})
	}
	if ls.part != nil {
		ls.messages, ls.plain = newShaped(ls.part), false
	}
	if offsetsOnCitus {
		ls.offsets = placed{citus.Placement(ms)}
	}
	if exists {
		s.found.Store(ls)
	}
	return ls, nil
}

// setupShape returns the partitioned shape that Setup works with. Its
// placement is Citus's wherever Citus is installed.
func (s *Store) setupShape(ctx context.Context) (*partitioned.Shape, error) {
	var citusInstalled bool
	if err := s.db.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`).Scan(&citusInstalled); err != nil {
		return nil, fmt.Errorf("pgdedup: setup %s: %w", s.messages.table, withDetail(err))
	}
	if citusInstalled {
		return s.partitioned(citus.NewPartitioned(s.messages.lockTimeoutMS, s.partitionFunc)), nil
	}
	return s.partitioned(partitioned.OneServer{Placement: plain.Placement(s.messages.lockTimeoutMS)}), nil
}

// env is what the Store's shapes are built from.
func (s *Store) env() shape.Env {
	return shape.Env{DB: s.db, Log: s.log, Table: s.messages.table, Retention: s.cfg.Retention,
		CleanupBatchSize: int64(s.cfg.CleanupBatchSize), LockTimeoutMS: s.messages.lockTimeoutMS}
}

// partitioned returns the partitioned shape of the Store's table on place.
func (s *Store) partitioned(place partitioned.Placement) *partitioned.Shape {
	pool, _ := s.db.(*pgxpool.Pool)
	conn, _ := s.db.(*pgx.Conn)
	return partitioned.New(partitioned.Config{Env: s.env(), SQL: s.messages.sql, Meta: s.partitionMeta, Place: place,
		Waits: &s.waits, Move: &s.move, Pool: pool, Conn: conn})
}

// messageStatements are a Store's SQL for processed_messages, built once in
// New.
type messageStatements struct {
	table         string // quoted, possibly schema-qualified
	lockTimeoutMS int64  // Config.LockTimeout in milliseconds, rounded up; 0 for none
	sql           plain.Statements
}

func newMessageStatements(table pgx.Identifier, retention, lockTimeout time.Duration) messageStatements {
	sql := plain.NewStatements(table.Sanitize(), retention, lockTimeout)
	return messageStatements{table: sql.Table, lockTimeoutMS: sql.LockTimeoutMS, sql: sql}
}

// partitionMeta is the quoted pgdedup_partitions beside table.
func partitionMeta(table pgx.Identifier) string { return partitioned.MetaName(table) }

// partitionFunc is the quoted Citus claim function beside table.
func partitionFunc(table pgx.Identifier) string { return citus.ClaimFunc(table) }

// createAhead starts creating the partitions ahead every interval while the
// table is partitioned, until ctx ends or stop is called. Only on a pool: a
// single connection cannot serve two goroutines.
func (s *Store) createAhead(ctx context.Context, interval time.Duration) (stop func()) {
	if _, ok := s.db.(*pgxpool.Pool); !ok {
		return func() {}
	}
	return partitioned.CreateAhead(ctx, max(interval, MinPartitionSpan/2), func(ctx context.Context) *partitioned.Shape {
		if ls, err := s.layouts(ctx, pgxQueryRow(s.db)); err == nil {
			return ls.part
		}
		return nil
	})
}
