package pgdedup

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// TopicPartition is one partition of a topic in a partitioned log such as Kafka, as
// a consumer holds it. pgdedup keeps one row per ([Config.Consumer], Topic,
// Partition) in [Config.OffsetTable], holding the highest offset whose effects
// committed: see [Store.ProcessOffsets].
type TopicPartition struct {
	// Topic is the topic's name: non-empty, valid UTF-8, without NUL, at most
	// [MaxMessageIDLen] bytes.
	Topic string

	// Partition is the partition's number, from 0.
	Partition int32

	// Generation is the holder's fencing token, from 0: the consumer group
	// generation in which the consumer was assigned the partition (franz-go:
	// the second result of GroupMetadata, read in kgo.AdjustFetchOffsetsFn). The
	// stored generation never goes down, and a claim made with an older
	// generation than the stored one fails with [ErrFenced], so a consumer that
	// lost the partition stops as soon as its successor has committed once.
	// Use generations for all claims of a consumer, or leave it 0 for all of
	// them (no fence; the offset check alone still prevents doubles).
	Generation int64
}

// offsetStatements are a Store's SQL for offsets, built once in New.
//
// The claim is one upsert. On conflict it updates only if the new offset is
// higher and the generation not older, and it keeps the value it replaces in
// prev_offset, so RETURNING prev_offset tells which offsets of a batch are new
// (all of them when the row was just inserted: prev_offset is NULL). The upsert
// locks the partition's row, so concurrent claims of one partition take turns;
// in read committed, the one that waited re-checks against the row the other
// committed. Nothing updated means a duplicate or a fenced claim; the stored
// row, read next in the same round trip and still locked by the upsert, says
// which. updated_at takes the inserted row's default, now(), rather than
// calling now() in the SET clause, which Citus refuses on a distributed
// table (only immutable functions may run there).
type offsetStatements struct {
	table  string
	claim  string // $1 consumer, $2 topic, $3 partition, $4 highest offset, $5 generation
	stored string // $1 consumer, $2 topic, $3 partition
	resume string // $1 consumer, $2 topics, $3 partitions
}

func newOffsetStatements(table pgx.Identifier) offsetStatements {
	t := table.Sanitize()
	return offsetStatements{
		table: t,
		claim: `INSERT INTO ` + t + ` AS o (consumer, topic, partition, last_offset, generation)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (consumer, topic, partition) DO UPDATE
SET prev_offset = o.last_offset, last_offset = EXCLUDED.last_offset, generation = EXCLUDED.generation, updated_at = EXCLUDED.updated_at
WHERE o.last_offset < EXCLUDED.last_offset AND o.generation <= EXCLUDED.generation
RETURNING prev_offset`,
		stored: `SELECT last_offset, generation FROM ` + t + ` WHERE consumer = $1 AND topic = $2 AND partition = $3`,
		resume: `SELECT topic, partition, last_offset + 1 FROM ` + t + `
WHERE consumer = $1 AND (topic, partition) IN (SELECT * FROM unnest($2::text[], $3::int[]))`,
	}
}

// ClaimOffset advances p's stored offset to offset inside tx, the caller's
// transaction, and reports whether offset is new: higher than the stored one.
// If tx commits, the offset is recorded; if tx rolls back, so is the claim. Run
// the business write in tx only when claimed is true. A duplicate (an offset at
// or below the stored one) returns (false, nil) and leaves tx usable.
//
// The claim locks p's row until tx ends: another transaction claiming p waits
// for it, then skips (tx committed a higher offset) or proceeds (tx rolled
// back); with [Config.LockTimeout] it gives up with [ErrInFlight] instead. A
// claim with an older p.Generation than the stored one returns [ErrFenced].
// ClaimOffset costs one round trip and does not retry. Claim the partitions of
// one transaction in a consistent order, or two transactions can deadlock.
func (s *Store) ClaimOffset(ctx context.Context, tx pgx.Tx, p TopicPartition, offset int64) (claimed bool, err error) {
	fresh, err := s.ClaimOffsets(ctx, tx, p, []int64{offset})
	return len(fresh) == 1, err
}

// ClaimOffsets is [Store.ClaimOffset] for a fetched batch of one partition: in
// one statement it advances p's stored offset to the highest of offsets and
// returns those above the previously stored one, in order. offsets must be
// strictly increasing (a fetch returns them so); gaps between them are allowed
// (Kafka leaves gaps after compaction and around transaction markers). The
// whole batch is rejected with [ErrInvalidOffset] before anything is sent if
// one offset is negative or out of order.
func (s *Store) ClaimOffsets(ctx context.Context, tx pgx.Tx, p TopicPartition, offsets []int64) (fresh []int64, err error) {
	return s.claimOffsets(p, offsets, func(c claim) error { return s.claimInTx(ctx, tx, c) })
}

// claimOffsets is ClaimOffsets and ClaimOffsetsSQL: it validates p and
// offsets, then run claims them in the caller's transaction.
func (s *Store) claimOffsets(p TopicPartition, offsets []int64, run func(claim) error) (fresh []int64, err error) {
	if err := validateOffsets(p, offsets); err != nil || len(offsets) == 0 {
		return nil, err
	}
	c := &offsetsClaim{store: s, p: p, offsets: offsets}
	if err := run(c); err != nil {
		return nil, err
	}
	return c.freshOffsets(), nil
}

// ResumeOffsets returns, for each partition of assigned (topic → partition
// numbers) that has a stored offset, the offset to resume consuming from: the
// last processed one plus 1. Seek every assigned partition to it before
// processing any of its records. With franz-go, return it from
// kgo.AdjustFetchOffsetsFn, which runs on every assignment after Kafka's
// offsets are fetched and before any record is (examples/kafka does so).
// Partitions without a stored offset are left out: nothing of
// them was processed, so start them where the consumer group's reset policy
// says. It is one statement.
func (s *Store) ResumeOffsets(ctx context.Context, assigned map[string][]int32) (map[string]map[int32]int64, error) {
	var topics []string
	var parts []int32
	for topic, ps := range assigned {
		for _, n := range ps {
			if err := validatePartition(TopicPartition{Topic: topic, Partition: n}); err != nil {
				return nil, err
			}
			topics, parts = append(topics, topic), append(parts, n)
		}
	}
	out := make(map[string]map[int32]int64)
	if len(topics) == 0 {
		return out, nil
	}
	rows, err := s.db.Query(ctx, s.offsets.resume, s.cfg.Consumer, topics, parts)
	if err != nil {
		return nil, fromDatabase(fmt.Errorf("pgdedup: read offsets: %w", withDetail(err)))
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
		return nil, fromDatabase(fmt.Errorf("pgdedup: read offsets: %w", withDetail(err)))
	}
	return out, nil
}

// offsetsClaim claims offsets of one partition: the upsert of its row, then
// the read of the stored row, which the upsert still locks, to tell a
// duplicate from a fenced claim when nothing was updated.
type offsetsClaim struct {
	store   *Store
	p       TopicPartition
	offsets []int64 // validated, not empty

	claimed   bool   // the upsert wrote the row
	prev      *int64 // the offset it replaced (nil: the row was new)
	last, gen int64  // the stored row after the upsert
}

func (c *offsetsClaim) statements(l *layouts) claimStatements {
	s, p := c.store, c.p
	*c = offsetsClaim{store: s, p: p, offsets: c.offsets}
	return claimStatements{settings: l.offsets.settings(false), claim: []statement{
		{sql: s.offsets.claim, args: []any{s.cfg.Consumer, p.Topic, p.Partition, c.offsets[len(c.offsets)-1], p.Generation},
			row: func(scan func(...any) error) error { c.claimed = true; return scan(&c.prev) }},
		{sql: s.offsets.stored, args: []any{s.cfg.Consumer, p.Topic, p.Partition},
			row: func(scan func(...any) error) error { return scan(&c.last, &c.gen) }},
	}}
}

func (c *offsetsClaim) outcome() (fresh, skipped int, err error) {
	if !c.claimed {
		if c.gen > c.p.Generation {
			return 0, 0, fmt.Errorf("%w: %s partition %d: claimed in generation %d, stored %d (offset %d)",
				ErrFenced, c.p.Topic, c.p.Partition, c.p.Generation, c.gen, c.last)
		}
		return 0, len(c.offsets), nil
	}
	n := len(c.freshOffsets())
	return n, len(c.offsets) - n, nil
}

// freshOffsets returns the offsets above the one stored before the claim.
func (c *offsetsClaim) freshOffsets() []int64 {
	if !c.claimed {
		return nil
	}
	i := 0
	if c.prev != nil {
		for i < len(c.offsets) && c.offsets[i] <= *c.prev {
			i++
		}
	}
	return c.offsets[i:]
}

func (c *offsetsClaim) subject() string {
	first, last := c.offsets[0], c.offsets[len(c.offsets)-1]
	if first == last {
		return fmt.Sprintf("%s partition %d offset %d", c.p.Topic, c.p.Partition, first)
	}
	return fmt.Sprintf("%s partition %d offsets %d-%d", c.p.Topic, c.p.Partition, first, last)
}

func (c *offsetsClaim) messageID() string { return "" }
func (c *offsetsClaim) size() int         { return len(c.offsets) }

func validatePartition(p TopicPartition) error {
	switch {
	case len(p.Topic) > MaxMessageIDLen:
		return fmt.Errorf("%w: topic of %d bytes, longer than %d", ErrInvalidOffset, len(p.Topic), MaxMessageIDLen)
	case p.Partition < 0:
		return fmt.Errorf("%w: partition %d is negative", ErrInvalidOffset, p.Partition)
	case p.Generation < 0:
		return fmt.Errorf("%w: generation %d is negative", ErrInvalidOffset, p.Generation)
	}
	if err := validateText(p.Topic); err != nil {
		return fmt.Errorf("%w: topic %s", ErrInvalidOffset, err)
	}
	return nil
}

// validateOffsets checks p and that offsets are non-negative and strictly
// increasing: the order in which a consumer must hand them over.
func validateOffsets(p TopicPartition, offsets []int64) error {
	if err := validatePartition(p); err != nil {
		return err
	}
	for i, o := range offsets {
		switch {
		case o < 0:
			return fmt.Errorf("%w: offset %d of %d is negative (%d)", ErrInvalidOffset, i, len(offsets), o)
		case i > 0 && o <= offsets[i-1]:
			return fmt.Errorf("%w: offset %d of %d (%d) is not above the one before (%d): hand over a partition's offsets in increasing order",
				ErrInvalidOffset, i, len(offsets), o, offsets[i-1])
		}
	}
	return nil
}
