package pgdedup

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup/internal/engine"
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
// choice is made once per Store, on first use. The engine (internal/engine)
// then asks the shape for each claim's statements. No other file of this
// package names Citus.

// layouts are the shapes of a Store's two tables, looked up on first use
// (see Store.layouts).
type layouts struct {
	engine.Layouts
	plain bool               // messages is the plain table on one server
	part  *partitioned.Shape // messages, if partitioned
	at    time.Time          // when they were looked up
}

// stale reports whether ls are due to be looked up again. A plain table is
// looked up every DefaultLayoutRecheck. So a Store follows a move to the
// partitioned layout (Setup on a populated table) before its switch time.
func (s *Store) stale(ls *layouts) bool {
	return ls.plain && s.move.Recheck >= 0 && time.Since(ls.at) >= cmp.Or(s.move.Recheck, partitioned.DefaultLayoutRecheck)
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
func (s *Store) layouts(ctx context.Context, query engine.QueryRow) (*layouts, error) {
	if ls := s.found.Load(); ls != nil && !s.stale(ls) {
		return ls, nil
	}
	var citusInstalled, exists, isPartitioned, messagesOnCitus, offsetsOnCitus bool
	if err := query(ctx, layoutQuery, []any{s.messages.table}, &citusInstalled, &exists, &isPartitioned); err != nil {
		return nil, engine.FromDatabase(fmt.Errorf("pgdedup: look up %s: %w", s.messages.table, withDetail(err)))
	}
	if citusInstalled {
		if err := query(ctx, citusLayoutQuery, []any{s.messages.table, s.offsets.Table}, &messagesOnCitus, &offsetsOnCitus); err != nil {
			return nil, engine.FromDatabase(fmt.Errorf("pgdedup: look up %s in pg_dist_partition: %w", s.messages.table, withDetail(err)))
		}
	}
	ms := s.messages.lockTimeoutMS
	ls := &layouts{Layouts: engine.Layouts{Messages: plain.New(s.env(), s.messages.sql), Offsets: plain.Placement(ms)}, plain: true, at: time.Now()}
	switch {
	case messagesOnCitus && isPartitioned:
		var since bool
		if err := query(ctx, citus.SinceQuery(s.partitionFunc), []any{s.messages.table}, &since); err != nil {
			return nil, engine.FromDatabase(fmt.Errorf("pgdedup: look up the claim function of %s: %w", s.messages.table, withDetail(err)))
		}
		span, err := s.partitionSpan(ctx, query)
		if err != nil {
			return nil, err
		}
		ls.part = s.partitionedSpan(citus.NewPartitioned(ms, s.partitionFunc, since), span)
	case messagesOnCitus:
		ls.Messages, ls.plain = citus.NewPlain(s.env(), s.messages.sql), false
	case isPartitioned:
		span, err := s.partitionSpan(ctx, query)
		if err != nil {
			return nil, err
		}
		ls.part = s.partitionedSpan(partitioned.OneServer{Placement: plain.Placement(ms)}, span)
	}
	if ls.part != nil {
		ls.Messages, ls.plain = ls.part, false
	}
	if offsetsOnCitus {
		ls.Offsets = citus.Placement(ms)
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
		return s.partitioned(citus.NewPartitioned(s.messages.lockTimeoutMS, s.partitionFunc, false)), nil
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
	return s.partitionedSpan(place, 0)
}

// partitionedSpan returns the partitioned shape of the Store's table on
// place, whose span is known (its claims can then be bounded), or zero.
func (s *Store) partitionedSpan(place partitioned.Placement, span time.Duration) *partitioned.Shape {
	pool, _ := s.db.(*pgxpool.Pool)
	conn, _ := s.db.(*pgx.Conn)
	return partitioned.New(partitioned.Config{Env: s.env(), SQL: s.messages.sql, Meta: s.partitionMeta, Place: place,
		Waits: &s.waits, Move: &s.move, Pool: pool, Conn: conn, Span: span, Clock: s.clock, Runway: s.cfg.Runway})
}

// partitionSpan reads the span of the Store's partitioned table, or zero
// if pgdedup_partitions has no row for it yet. Its claims then fail as
// they would anyway. The first statement does not name
// pgdedup_partitions, which may be missing, and then the span is zero too.
func (s *Store) partitionSpan(ctx context.Context, query engine.QueryRow) (time.Duration, error) {
	var metaExists bool
	err := query(ctx, `SELECT to_regclass($1) IS NOT NULL`, []any{s.partitionMeta}, &metaExists)
	var us int64
	if err == nil && metaExists {
		err = query(ctx, `SELECT coalesce((SELECT (extract(epoch FROM span) * 1000000)::bigint FROM `+s.partitionMeta+`
WHERE parent = to_regclass($1)), 0)`, []any{s.messages.table}, &us)
	}
	if err != nil {
		return 0, engine.FromDatabase(fmt.Errorf("pgdedup: look up the span of %s: %w", s.messages.table, withDetail(err)))
	}
	return time.Duration(us) * time.Microsecond, nil
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
		if ls, err := s.layouts(ctx, engine.PgxQueryRow(s.db)); err == nil {
			return ls.part
		}
		return nil
	})
}
