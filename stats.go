package pgdedup

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgdedup/pgdedup/internal/engine"
	"github.com/pgdedup/pgdedup/internal/shape"
)

// Stats is what the dedup table holds, as read by [Store.Stats]. It counts
// rows per consumer and the expired rows that the next [Store.Cleanup]
// deletes, and gives the table's size on disk. Its JSON form is the output of
// `pgdedup stats --json`.
type Stats struct {
	// Now is the database's clock when the rows were counted. Expiry is
	// measured against it.
	Now         time.Time `json:"now"`
	Rows        int64     `json:"rows"`         // rows of every consumer
	ExpiredRows int64     `json:"expired_rows"` // rows whose expires_at has passed
	TableBytes  int64     `json:"table_bytes"`  // the heap, with its TOAST table and maps (pg_table_size)
	IndexBytes  int64     `json:"index_bytes"`  // all its indexes (pg_indexes_size)
	TotalBytes  int64     `json:"total_bytes"`  // table and indexes (pg_total_relation_size)

	// DeadTuples is PostgreSQL's estimate of the rows deleted (by Cleanup)
	// whose space vacuum has not reclaimed yet (pg_stat_user_tables.n_dead_tup).
	// A figure that keeps growing past the rows one Cleanup deletes means
	// vacuum does not keep up (see docs/operations.md).
	DeadTuples int64 `json:"dead_tuples"`
	// LastVacuum and LastAutovacuum are when the table was last vacuumed by
	// hand and by autovacuum, nil if never since the statistics were reset.
	LastVacuum     *time.Time `json:"last_vacuum"`
	LastAutovacuum *time.Time `json:"last_autovacuum"`
	// Indexes lists each index of the table with its size, ordered by name.
	// Their sizes add up to IndexBytes.
	Indexes []IndexStats `json:"indexes"`

	// PartitionSpan, SealedBefore and Partitions describe a table of the
	// [LayoutPartitioned] layout, and are zero otherwise. They are the claim
	// time each partition covers, the time before which partitions are sealed
	// (claims look them up rather than insert into them), and the partitions
	// by time. Sizes and DeadTuples above are then the partitions' total, and
	// Indexes is empty.
	PartitionSpan time.Duration    `json:"partition_span,omitempty"`
	SealedBefore  *time.Time       `json:"sealed_before,omitempty"`
	Partitions    []PartitionStats `json:"partitions,omitempty"`
	// PartitionRunway is how long after Now claims find a partition if no
	// [Store.Cleanup] runs (nil on the plain layout). Cleanup keeps it
	// between 3 and 4 spans. In JSON, nanoseconds.
	PartitionRunway *time.Duration `json:"partition_runway,omitempty"`

	// Consumers has one entry per consumer with rows, ordered by name. It is
	// empty, not nil, for an empty table.
	Consumers []ConsumerStats `json:"consumers"`
}

// IndexStats is one index of the table in [Stats].
type IndexStats struct {
	Name   string `json:"name"`
	Method string `json:"method"` // btree, brin, hash…
	Bytes  int64  `json:"bytes"`  // all its forks (pg_total_relation_size of the index)
}

// PartitionStats is one partition of a [LayoutPartitioned] table in [Stats].
type PartitionStats struct {
	Name      string    `json:"name"`
	From      time.Time `json:"from"` // it holds the claims From ≤ processed_at < To
	To        time.Time `json:"to"`
	Sealed    bool      `json:"sealed"`    // claims look it up instead of inserting into it
	Detaching bool      `json:"detaching"` // an interrupted DETACH CONCURRENTLY, which the next Cleanup finishes
	Rows      int64     `json:"rows"`      // counted, hand-over copies included (docs/partitioning.md)
	Bytes     int64     `json:"bytes"`     // table and indexes
}

// ConsumerStats are one consumer's rows in [Stats].
type ConsumerStats struct {
	Consumer          string    `json:"consumer"`
	Rows              int64     `json:"rows"`
	ExpiredRows       int64     `json:"expired_rows"`
	OldestProcessedAt time.Time `json:"oldest_processed_at"`
	// NextExpiry is the earliest expires_at among the rows not yet expired, or
	// nil when every row has expired.
	NextExpiry *time.Time `json:"next_expiry"`
}

// Stats reads the dedup table's rows per consumer, expired rows, size, dead
// tuples, last vacuums and index sizes. Like [Store.Cleanup] it covers every
// consumer in the table, not only the [Store]'s. It counts the whole table in
// one sequential scan, which takes seconds on tens of millions of rows. So
// read it every minute or so, not per message. Times are in UTC. It needs
// only SELECT on the table.
//
// On a table Citus distributes, the sizes are the shards' total. DeadTuples,
// LastVacuum, LastAutovacuum and Indexes are left empty there, because the
// coordinator's own table is an empty shell and the workers vacuum the
// shards.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	var exists bool
	err := s.db.QueryRow(ctx, `SELECT now(), r IS NOT NULL,
coalesce(pg_table_size(r), 0), coalesce(pg_indexes_size(r), 0), coalesce(pg_total_relation_size(r), 0)
FROM to_regclass($1::text) r`, s.messages.table).Scan(&st.Now, &exists, &st.TableBytes, &st.IndexBytes, &st.TotalBytes)
	if err != nil {
		return Stats{}, fmt.Errorf("pgdedup: stats of %s: read sizes: %w", s.messages.table, err)
	}
	if !exists {
		return Stats{}, fmt.Errorf("pgdedup: stats of %s: table not found (run Migrate)", s.messages.table)
	}
	ls, err := s.layouts(ctx, engine.PgxQueryRow(s.db))
	if err != nil {
		return Stats{}, err // it names the table
	}
	if err := shapeSizes(ctx, ls.Messages, &st); err != nil {
		return Stats{}, err
	}
	// The first statement's now() is passed on, so that "expired" means the
	// same instant in both even though they are two statements.
	rows, _ := s.db.Query(ctx, `SELECT consumer, count(*), count(*) FILTER (WHERE expires_at < $1),
min(processed_at), min(expires_at) FILTER (WHERE expires_at >= $1)
FROM `+s.messages.table+` GROUP BY consumer ORDER BY consumer`, st.Now)
	st.Consumers, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (cs ConsumerStats, err error) {
		err = row.Scan(&cs.Consumer, &cs.Rows, &cs.ExpiredRows, &cs.OldestProcessedAt, &cs.NextExpiry)
		return cs, err
	})
	if err != nil {
		return Stats{}, fmt.Errorf("pgdedup: stats of %s: read consumers: %w", s.messages.table, err)
	}
	st.Now = st.Now.UTC()
	if st.Consumers == nil {
		st.Consumers = []ConsumerStats{}
	}
	if st.Indexes == nil {
		st.Indexes = []IndexStats{}
	}
	for i := range st.Consumers {
		cs := &st.Consumers[i]
		st.Rows += cs.Rows
		st.ExpiredRows += cs.ExpiredRows
		cs.OldestProcessedAt = cs.OldestProcessedAt.UTC()
		if cs.NextExpiry != nil {
			*cs.NextExpiry = cs.NextExpiry.UTC()
		}
	}
	return st, nil
}

// shapeSizes fills in st's sizes, and what else sh can say of the
// table's storage.
func shapeSizes(ctx context.Context, sh shape.Shape, st *Stats) error {
	sz := shape.Sizes{Now: st.Now, TableBytes: st.TableBytes, IndexBytes: st.IndexBytes, TotalBytes: st.TotalBytes}
	err := sh.Sizes(ctx, &sz)
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
