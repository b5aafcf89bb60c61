package pgdedup

import (
	"context"
	"database/sql"

	"github.com/pgdedup/pgdedup/internal/engine"
)

// ClaimSQL is [Store.Claim] for services that reach Postgres through
// database/sql, such as sqlc, sqlx, bun, or GORM over pgx's stdlib driver or
// lib/pq. It records messageID for the [Store]'s consumer inside tx and
// reports whether it is new. The claim commits or rolls back with tx, so run
// the business write in tx only when claimed is true.
//
// It runs the same statement as Claim, with the same validation, and behaves
// the same. A duplicate returns (false, nil) and leaves tx usable. Another
// transaction holding the ID is waited for. With [Config.LockTimeout] that
// wait gives [ErrInFlight], after which tx is aborted and must be rolled back.
// It does not retry. The Store's own [DB] is not used, and tx may come from
// any *sql.DB on the same database.
//
// Without Config.LockTimeout the claim is one round trip. database/sql cannot
// pipeline as pgx does, so with it the claim costs three. The first sets the
// transaction-local timeout in one multi-statement Exec without arguments.
// The second is the claim, and the third restores the previous lock_timeout.
//
// opts are as in [Store.Claim]. With [WithFingerprint] the fingerprint is
// read back in one more round trip.
func (s *Store) ClaimSQL(ctx context.Context, tx *sql.Tx, messageID string, opts ...Option) (claimed bool, err error) {
	return s.claimID("ClaimSQL", messageID, opts, func(c engine.Claim) error { return s.eng.ClaimInSQL(ctx, tx, c) })
}

// ClaimBatchSQL is [Store.ClaimBatch] for database/sql. It records messageIDs
// inside tx and returns the ones that are new, each once, in the order they
// first appear in messageIDs. It runs ClaimBatch's statements, sorted the same
// way so that overlapping batches cannot deadlock. It rejects the batch as
// ClaimBatch does, before anything is sent. Round trips and
// [Config.LockTimeout] are as in [Store.ClaimSQL].
//
// The IDs and their keys travel as array parameters written as Postgres
// array literals, so no driver-specific array type is needed. opts are as in
// [Store.ProcessBatch].
func (s *Store) ClaimBatchSQL(ctx context.Context, tx *sql.Tx, messageIDs []string, opts ...Option) (fresh []string, err error) {
	return s.claimBatch("ClaimBatchSQL", messageIDs, opts, func(c engine.Claim) error { return s.eng.ClaimInSQL(ctx, tx, c) })
}

// ClaimOffsetsSQL is [Store.ClaimOffsets] for database/sql. Inside tx it
// advances p's stored offset to the highest of offsets and returns those above
// the previously stored one. It validates as ClaimOffsets does. It costs two
// round trips, the claim and then the read of the stored row that tells a
// duplicate from a fenced claim, plus two with [Config.LockTimeout].
func (s *Store) ClaimOffsetsSQL(ctx context.Context, tx *sql.Tx, p TopicPartition, offsets []int64) (fresh []int64, err error) {
	return s.claimOffsets(p, offsets, func(c engine.Claim) error { return s.eng.ClaimInSQL(ctx, tx, c) })
}
