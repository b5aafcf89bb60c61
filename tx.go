package pgdedup

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/pgdedup/pgdedup/internal/engine"
)

// Claim records messageID for the [Store]'s consumer inside tx, the caller's
// transaction, and reports whether it is new. The claim commits or rolls back
// with tx. Run the business write in tx only when claimed is true.
//
// A duplicate returns (false, nil) and leaves tx usable. The insert uses
// ON CONFLICT DO NOTHING, so no unique violation aborts tx. If another
// transaction holds the same ID, Claim waits for it to end. With
// [Config.LockTimeout] it returns [ErrInFlight] instead, and tx is then
// aborted and must be rolled back. Claim costs one round trip and does not
// retry, because retrying is the business of whoever owns tx.
//
// Claim reports duplicates and in-flight give-ups to [Config.OnEvent]. It
// never reports [EventProcessed], since only the owner of tx knows whether tx
// commits. opts are as in [Store.Process], except [WithMaxResultBytes], which
// Claim refuses. A [PayloadMismatchError] leaves tx usable.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, messageID string, opts ...Option) (claimed bool, err error) {
	return s.claimID("Claim", messageID, opts, func(c engine.Claim) error { return s.eng.ClaimIn(ctx, tx, c) })
}

// ClaimBatch records messageIDs inside tx, the caller's transaction, and
// returns the ones that are new. fresh keeps the order in which they first
// appear in messageIDs, and an ID repeated in the batch counts once. Like
// [Store.Claim], it leaves tx usable when some IDs are duplicates, and the
// claims commit or roll back with tx.
//
// It is one round trip whatever the batch size. The IDs are inserted in the
// order of their keys (see [Key]), which is the primary key's order, so
// overlapping batches cannot deadlock. An invalid ID rejects the whole batch
// with [ErrInvalidMessageID], naming its index. A batch of more than
// [Config.MaxBatch] IDs is rejected with [ErrBatchTooLarge]. Both happen
// before anything is sent. opts are as in [Store.ProcessBatch].
func (s *Store) ClaimBatch(ctx context.Context, tx pgx.Tx, messageIDs []string, opts ...Option) (fresh []string, err error) {
	return s.claimBatch("ClaimBatch", messageIDs, opts, func(c engine.Claim) error { return s.eng.ClaimIn(ctx, tx, c) })
}

// ClaimOffset advances p's stored offset to offset inside tx, the caller's
// transaction. It reports whether offset is new, which means higher than the
// stored one. The claim commits or rolls back with tx. Run the business write
// in tx only when claimed is true. A duplicate, an offset at or below the
// stored one, returns (false, nil) and leaves tx usable.
//
// The claim locks p's row until tx ends. Another transaction claiming p waits
// for it and then skips (tx committed a higher offset) or proceeds (tx rolled
// back). With [Config.LockTimeout] it gives up with [ErrInFlight] instead. A
// claim with an older p.Generation than the stored one returns [ErrFenced].
// ClaimOffset costs one round trip and does not retry. Claim the partitions
// of one transaction in a consistent order, or two transactions can deadlock.
func (s *Store) ClaimOffset(ctx context.Context, tx pgx.Tx, p TopicPartition, offset int64) (claimed bool, err error) {
	fresh, err := s.ClaimOffsets(ctx, tx, p, []int64{offset})
	return len(fresh) == 1, err
}

// ClaimOffsets is [Store.ClaimOffset] for a fetched batch of one partition.
// In one statement it advances p's stored offset to the highest of offsets
// and returns those above the previously stored one, in order. offsets must
// be strictly increasing, as a fetch returns them. Gaps are allowed, since
// Kafka leaves them after compaction and around transaction markers. An
// offset that is negative or out of order rejects the whole batch with
// [ErrInvalidOffset] before anything is sent.
func (s *Store) ClaimOffsets(ctx context.Context, tx pgx.Tx, p TopicPartition, offsets []int64) (fresh []int64, err error) {
	return s.claimOffsets(p, offsets, func(c engine.Claim) error { return s.eng.ClaimIn(ctx, tx, c) })
}
