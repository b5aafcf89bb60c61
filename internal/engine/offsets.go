package engine

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// OffsetSQL is a Store's SQL for offsets, built once in New.
//
// The claim is one upsert. On conflict it updates only if the new offset is
// higher and the generation not older. It keeps the value it replaces in
// prev_offset, so RETURNING prev_offset tells which offsets of a batch are
// new. All of them are new when the row was just inserted, with prev_offset
// NULL. The upsert locks the partition's row, so concurrent claims of one
// partition take turns. In read committed, the one that waited re-checks
// against the row the other committed. Nothing updated means a duplicate or a
// fenced claim. The stored row, read next in the same round trip and still
// locked by the upsert, says which. updated_at takes the inserted row's
// default, now(), rather than calling now() in the SET clause. Citus refuses
// that on a distributed table, where only immutable functions may run.
type OffsetSQL struct {
	Table  string // quoted, possibly schema-qualified
	Claim  string // $1 consumer, $2 topic, $3 partition, $4 highest offset, $5 generation
	Stored string // $1 consumer, $2 topic, $3 partition
	Resume string // $1 consumer, $2 topics, $3 partitions
}

// NewOffsetSQL returns the SQL for t, the quoted offset table.
func NewOffsetSQL(t string) OffsetSQL {
	return OffsetSQL{
		Table: t,
		Claim: `INSERT INTO ` + t + ` AS o (consumer, topic, partition, last_offset, generation)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (consumer, topic, partition) DO UPDATE
SET prev_offset = o.last_offset, last_offset = EXCLUDED.last_offset, generation = EXCLUDED.generation, updated_at = EXCLUDED.updated_at
WHERE o.last_offset < EXCLUDED.last_offset AND o.generation <= EXCLUDED.generation
RETURNING prev_offset`,
		Stored: `SELECT last_offset, generation FROM ` + t + ` WHERE consumer = $1 AND topic = $2 AND partition = $3`,
		Resume: `SELECT topic, partition, last_offset + 1 FROM ` + t + `
WHERE consumer = $1 AND (topic, partition) IN (SELECT * FROM unnest($2::text[], $3::int[]))`,
	}
}

// OffsetsClaim claims offsets of one topic partition. It sends the upsert of
// the partition's row and then reads the stored row, which the upsert still
// locks. When nothing was updated, that row tells a duplicate from a fenced
// claim.
type OffsetsClaim struct {
	Consumer, Topic string
	Partition       int32
	Generation      int64
	Offsets         []int64 // validated, not empty
	SQL             OffsetSQL

	claimed   bool   // the upsert wrote the row
	prev      *int64 // the offset it replaced, nil if the row was new
	last, gen int64  // the stored row after the upsert
}

// Statements implements [Claim].
func (c *OffsetsClaim) Statements(l *Layouts) Statements {
	c.claimed, c.prev, c.last, c.gen = false, nil, 0, 0
	return Statements{Settings: l.Offsets.Settings(false), Claim: []shape.Statement{
		{SQL: c.SQL.Claim, Args: []any{c.Consumer, c.Topic, c.Partition, c.Offsets[len(c.Offsets)-1], c.Generation},
			Row: func(scan func(...any) error) error { c.claimed = true; return scan(&c.prev) }},
		{SQL: c.SQL.Stored, Args: []any{c.Consumer, c.Topic, c.Partition},
			Row: func(scan func(...any) error) error { return scan(&c.last, &c.gen) }},
	}}
}

func (c *OffsetsClaim) Outcome() (fresh, skipped int, err error) {
	if !c.claimed {
		if c.gen > c.Generation {
			return 0, 0, fmt.Errorf("%w: %s partition %d: claimed in generation %d, stored %d (offset %d)",
				ErrFenced, c.Topic, c.Partition, c.Generation, c.gen, c.last)
		}
		return 0, len(c.Offsets), nil
	}
	n := len(c.FreshOffsets())
	return n, len(c.Offsets) - n, nil
}

// FreshOffsets returns the offsets above the one stored before the claim.
func (c *OffsetsClaim) FreshOffsets() []int64 {
	if !c.claimed {
		return nil
	}
	i := 0
	if c.prev != nil {
		for i < len(c.Offsets) && c.Offsets[i] <= *c.prev {
			i++
		}
	}
	return c.Offsets[i:]
}

func (c *OffsetsClaim) Subject() string {
	first, last := c.Offsets[0], c.Offsets[len(c.Offsets)-1]
	if first == last {
		return fmt.Sprintf("%s partition %d offset %d", c.Topic, c.Partition, first)
	}
	return fmt.Sprintf("%s partition %d offsets %d-%d", c.Topic, c.Partition, first, last)
}

func (c *OffsetsClaim) MessageID() string { return "" }
func (c *OffsetsClaim) Size() int         { return len(c.Offsets) }

// ResumeOffsets reads the offset to resume from, the stored one plus 1, of
// each partition of topics and parts that has a stored offset. topics[i]
// and parts[i] are one partition.
func (e *Engine) ResumeOffsets(ctx context.Context, topics []string, parts []int32) (map[string]map[int32]int64, error) {
	out := make(map[string]map[int32]int64)
	if len(topics) == 0 {
		return out, nil
	}
	rows, err := e.DB.Query(ctx, e.Offsets.Resume, e.Consumer, topics, parts)
	if err != nil {
		return nil, FromDatabase(fmt.Errorf("pgdedup: read offsets: %w", shape.WithDetail(err)))
	}
	var topic string
	var n int32
	var next int64
	_, err = pgx.ForEachRow(rows, []any{&topic, &n, &next}, func() error {
		if out[topic] == nil {
			out[topic] = make(map[int32]int64)
		}
		out[topic][n] = next
		return nil
	})
	if err != nil {
		return nil, FromDatabase(fmt.Errorf("pgdedup: read offsets: %w", shape.WithDetail(err)))
	}
	return out, nil
}
