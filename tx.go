package pgdedup

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Claim records messageID for the [Store]'s consumer inside tx, the caller's
// transaction, and reports whether it is new. If tx commits, the ID is
// recorded; if tx rolls back, so does the claim. Run the business write in tx
// only when claimed is true.
//
// A duplicate returns (false, nil) and leaves tx usable: the insert uses
// ON CONFLICT DO NOTHING, so no unique violation aborts it. If another
// transaction holds the same ID, Claim waits for it to end (or, with
// [Config.LockTimeout], returns [ErrInFlight], after which tx is aborted and must be
// rolled back). Claim costs one round trip and does not retry: retrying is the
// business of whoever owns tx. It reports duplicates and in-flight give-ups
// to [Config.OnEvent]; [EventProcessed] is the Process calls' alone, since
// only the owner of tx knows whether it commits.
//
// opts are as in [Store.Process]. A [PayloadMismatchError] leaves tx usable.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, messageID string, opts ...Option) (claimed bool, err error) {
	return s.claimID("Claim", messageID, opts, func(c claim) error { return s.claimInTx(ctx, tx, c) })
}

// ClaimBatch records messageIDs inside tx, the caller's transaction, and returns
// the ones that are new, in the order they first appear in messageIDs (an ID
// repeated in the batch counts once). Like [Store.Claim], it leaves tx usable when some
// IDs are duplicates, and the claims commit or roll back with tx.
//
// Whatever the batch size it is one round trip. The IDs are inserted in the
// order of their keys (see [Key]), the primary key's order, so overlapping
// batches cannot deadlock. If any ID is invalid, the whole batch is rejected
// with [ErrInvalidMessageID], naming its index, and a batch of more than
// [Config.MaxBatch] IDs with [ErrBatchTooLarge], before anything is sent.
func (s *Store) ClaimBatch(ctx context.Context, tx pgx.Tx, messageIDs []string) (fresh []string, err error) {
	return s.claimBatch(messageIDs, func(c claim) error { return s.claimInTx(ctx, tx, c) })
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
