package pgdedup

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Partition is one partition of a topic in a partitioned log such as Kafka, as
// a consumer holds it. pgdedup keeps one row per ([Config.Consumer], Topic,
// Partition) in [Config.OffsetTable], holding the highest offset whose effects
// committed: see [Store.ProcessOffsets].
type Partition struct {
	// Topic is the topic's name: non-empty, valid UTF-8, without NUL, at most
	// [MaxMessageIDLen] bytes.
	Topic string

	// Partition is the partition's number, from 0.
	Partition int32

	// Generation is the holder's fencing token, from 0: the consumer group
	// generation in which the consumer was assigned the partition (franz-go:
	// the second result of GroupMetadata, read in OnPartitionsAssigned). The
	// stored generation never goes down, and a claim made with an older
	// generation than the stored one fails with [ErrFenced], so a consumer that
	// lost the partition stops as soon as its successor has committed once.
	// Use generations for all claims of a consumer, or leave it 0 for all of
	// them (no fence; the offset check alone still prevents doubles).
	Generation int64
}

var (
	// ErrInvalidOffset is returned, wrapped with the reason, for a Partition or
	// offsets that cannot be claimed: an empty or invalid topic, a negative
	// partition, generation or offset, or a batch whose offsets are not strictly
	// increasing. Nothing is sent to the database.
	ErrInvalidOffset = errors.New("pgdedup: invalid offset")

	// ErrFenced is returned when a claim's [Partition.Generation] is older than
	// the one stored for the partition: another consumer was assigned the
	// partition in a later generation and has committed since. Nothing was
	// claimed; roll back, stop processing the partition and wait for the next
	// assignment (and its offsets from [Store.ResumeOffsets]).
	ErrFenced = errors.New("pgdedup: partition is held by a newer generation")
)

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
// which.
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
SET prev_offset = o.last_offset, last_offset = EXCLUDED.last_offset, generation = EXCLUDED.generation, updated_at = now()
WHERE o.last_offset < EXCLUDED.last_offset AND o.generation <= EXCLUDED.generation
RETURNING prev_offset`,
		stored: `SELECT last_offset, generation FROM ` + t + ` WHERE consumer = $1 AND topic = $2 AND partition = $3`,
		resume: `SELECT topic, partition, last_offset + 1 FROM ` + t + `
WHERE consumer = $1 AND (topic, partition) IN (SELECT * FROM unnest($2::text[], $3::int[]))`,
	}
}

// defaultOffsetTable is processed_offsets in the schema of table, if any.
func defaultOffsetTable(table pgx.Identifier) string {
	if len(table) == 2 {
		return table[0] + ".processed_offsets"
	}
	return "processed_offsets"
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
func (s *Store) ClaimOffset(ctx context.Context, tx pgx.Tx, p Partition, offset int64) (claimed bool, err error) {
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
func (s *Store) ClaimOffsets(ctx context.Context, tx pgx.Tx, p Partition, offsets []int64) (fresh []int64, err error) {
	if err := validateOffsets(p, offsets); err != nil || len(offsets) == 0 {
		return nil, err
	}
	b := &pgx.Batch{}
	s.queueClaimOffsets(b, p, offsets)
	return s.readClaimOffsets(tx.SendBatch(ctx, b), p, offsets, false)
}

// ResumeOffsets returns, for each partition of assigned (topic → partition
// numbers) that has a stored offset, the offset to resume consuming from: the
// last processed one plus 1. Seek every assigned partition to it before
// processing any of its records (franz-go: in OnPartitionsAssigned, with
// SetOffsets). Partitions without a stored offset are left out: nothing of
// them was processed, so start them where the consumer group's reset policy
// says. It is one statement.
func (s *Store) ResumeOffsets(ctx context.Context, assigned map[string][]int32) (map[string]map[int32]int64, error) {
	var topics []string
	var parts []int32
	for topic, ps := range assigned {
		for _, n := range ps {
			if err := validatePartition(Partition{Topic: topic, Partition: n}); err != nil {
				return nil, err
			}
			topics, parts = append(topics, topic), append(parts, n)
		}
	}
	out := make(map[string]map[int32]int64)
	if len(topics) == 0 {
		return out, nil
	}
	rows, err := s.db.Query(ctx, s.off.resume, s.cfg.Consumer, topics, parts)
	if err != nil {
		return nil, fmt.Errorf("pgdedup: read offsets: %w", err)
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
		return nil, fmt.Errorf("pgdedup: read offsets: %w", err)
	}
	return out, nil
}

// queueClaimOffsets queues the claim (bracketed by the lock timeout statements
// when configured) and the read of the stored row onto b, which may already
// hold a BEGIN. offsets are validated and not empty.
func (s *Store) queueClaimOffsets(b *pgx.Batch, p Partition, offsets []int64) {
	queueAround(b, s.sql.lockTimeout, s.off.claim, s.cfg.Consumer, p.Topic, p.Partition, offsets[len(offsets)-1], p.Generation)
	b.Queue(s.off.stored, s.cfg.Consumer, p.Topic, p.Partition)
}

// readClaimOffsets reads what queueClaimOffsets queued and closes br.
func (s *Store) readClaimOffsets(br pgx.BatchResults, p Partition, offsets []int64, begun bool) ([]int64, error) {
	var claimed bool
	var prev *int64
	var last, gen int64
	err := skipLeading(br, begun, s.sql.lockTimeout)
	if err == nil {
		err = br.QueryRow().Scan(&prev)
		if claimed = err == nil; errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
	}
	for range s.sql.lockTimeout.after {
		if err == nil {
			_, err = br.Exec()
		}
	}
	if err == nil {
		err = br.QueryRow().Scan(&last, &gen)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, s.claimError(err, fmt.Sprintf("%s/%d/%d", p.Topic, p.Partition, offsets[len(offsets)-1]))
	}
	if !claimed {
		if gen > p.Generation {
			return nil, fmt.Errorf("%w: %s partition %d: claimed in generation %d, stored %d (offset %d)",
				ErrFenced, p.Topic, p.Partition, p.Generation, gen, last)
		}
		return nil, nil
	}
	i := 0
	if prev != nil {
		for i < len(offsets) && offsets[i] <= *prev {
			i++
		}
	}
	return offsets[i:], nil
}

func validatePartition(p Partition) error {
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
func validateOffsets(p Partition, offsets []int64) error {
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
