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
	c, err := s.newIDClaim(messageID, opts)
	if err != nil {
		return false, err
	}
	if err := s.claimInTx(ctx, tx, c); err != nil {
		return false, err
	}
	return c.claimed, nil
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
	c, err := s.newBatchClaim(messageIDs)
	if err != nil || len(c.sorted.ids) == 0 {
		return nil, err
	}
	if err := s.claimInTx(ctx, tx, c); err != nil {
		return nil, err
	}
	return c.freshIDs(), nil
}
