package pgdedup

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// ProcessOffset runs fn for the record at offset of partition p unless p's
// stored offset is already at or above it, in one transaction with advancing
// the stored offset to offset, and reports whether fn ran. It is
// [Store.ProcessOffsets] for one record; the rules for the consumer are there.
func (s *Store) ProcessOffset(ctx context.Context, p TopicPartition, offset int64, fn func(ctx context.Context, tx pgx.Tx) error) (processed bool, err error) {
	if fn == nil {
		return false, errNilFunc
	}
	fresh, err := s.ProcessOffsets(ctx, p, []int64{offset}, func(ctx context.Context, tx pgx.Tx, _ []int64) error {
		return fn(ctx, tx)
	})
	return len(fresh) == 1, err
}

// ProcessOffsets is the offset counterpart of [Store.ProcessBatch], for a
// partitioned log such as Kafka: one row per (consumer, topic, partition)
// holds the last processed offset, instead of one row per message. In one
// transaction it advances p's stored offset to the highest of offsets and runs
// fn once with the offsets above the previously stored one (fresh), in order;
// the effects and the offset commit together. When none is above it, fn is not
// called and fresh is empty: the records were processed before (a redelivery
// after a rebalance or a crash). BEGIN and the claim, one statement whatever
// the batch size, are one round trip.
//
// offsets must be strictly increasing; gaps are allowed, since Kafka offsets
// have them (compaction, transaction markers). Errors, panics and retries
// behave as in [Store.Process]; a claim older than the stored generation
// returns [ErrFenced] (see [TopicPartition]).
//
// What the database enforces: the stored offset only moves forward, so a
// record at or below it is never processed again, by this consumer or by a
// zombie that still holds a revoked partition; concurrent claims of a
// partition take turns on its row. What the consumer must keep, because a
// skipped record cannot be told from a gap: hand each partition's records over
// in offset order, one transaction at a time, starting from the offset
// [Store.ResumeOffsets] returned on assignment, without skipping a fetched
// record. After an error, do not go on to the partition's later records: retry,
// or seek back to the stored offset. A poison record is skipped by committing
// its offset with an fn that records it elsewhere (a dead-letter table).
func (s *Store) ProcessOffsets(ctx context.Context, p TopicPartition, offsets []int64, fn func(ctx context.Context, tx pgx.Tx, fresh []int64) error) (fresh []int64, err error) {
	if err := validateOffsets(p, offsets); err != nil || len(offsets) == 0 {
		return nil, err
	}
	if fn == nil {
		return nil, errNilFunc
	}
	c := &offsetsClaim{store: s, p: p, offsets: offsets}
	committed, err := s.process(ctx, c, func(ctx context.Context, tx pgx.Tx) error { return fn(ctx, tx, c.freshOffsets()) })
	if !committed {
		return nil, err
	}
	return c.freshOffsets(), err
}
