package pgdedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ProcessOffset runs fn for the record at offset of partition p unless p's
// stored offset is already at or above it, in one transaction with advancing
// the stored offset to offset, and reports whether fn ran. It is
// [Store.ProcessOffsets] for one record; the rules for the consumer are there.
func (s *Store) ProcessOffset(ctx context.Context, p Partition, offset int64, fn func(ctx context.Context, tx pgx.Tx) error) (processed bool, err error) {
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
// returns [ErrFenced] (see [Partition]).
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
func (s *Store) ProcessOffsets(ctx context.Context, p Partition, offsets []int64, fn func(ctx context.Context, tx pgx.Tx, fresh []int64) error) (fresh []int64, err error) {
	if err := validateOffsets(p, offsets); err != nil || len(offsets) == 0 {
		return nil, err
	}
	if fn == nil {
		return nil, errNilFunc
	}
	err = s.retry(ctx, "", func() error {
		var err error
		fresh, err = s.processOffsetsOnce(ctx, p, offsets, fn)
		return err
	})
	return fresh, err
}

func (s *Store) processOffsetsOnce(ctx context.Context, p Partition, offsets []int64, fn func(context.Context, pgx.Tx, []int64) error) ([]int64, error) {
	start := time.Now()
	br, tx := s.beginWith(ctx, func(b *pgx.Batch) { s.queueClaimOffsets(b, p, offsets) })
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit; on failure pgx closes the connection

	fresh, err := s.readClaimOffsets(br, p, offsets, true)
	if err != nil {
		if errors.Is(err, ErrFenced) {
			s.log.WarnContext(ctx, "pgdedup: fenced", "consumer", s.cfg.Consumer, "topic", p.Topic, "partition", p.Partition, "generation", p.Generation)
		}
		s.inFlight(ctx, err, "", len(offsets))
		return nil, err
	}
	if dups := len(offsets) - len(fresh); dups > 0 {
		s.duplicate(ctx, "", dups)
	}
	if len(fresh) == 0 {
		return nil, tx.Rollback(ctx)
	}
	if err := fn(ctx, tx, fresh); err != nil {
		return nil, fromFn(tx, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fromDatabase(fmt.Errorf("pgdedup: commit %s partition %d offsets %d-%d: %w", p.Topic, p.Partition, fresh[0], fresh[len(fresh)-1], withDetail(err)))
	}
	s.emit(ctx, Event{Kind: EventProcessed, Count: int64(len(fresh)), Duration: time.Since(start)})
	return fresh, nil
}
