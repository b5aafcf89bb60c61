package pgdedup

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ProcessResult is [Store.Process] for consumers that answer requests (RPC
// over a reply-to queue, NATS request/reply, a handler keyed by a request
// ID): fn returns the answer, which is stored with the claim of messageID in
// fn's transaction, and a duplicate gets the first answer back instead of a
// new one.
//
// For a new ID, fn runs and its result is stored before COMMIT; ProcessResult
// returns it with processed true. For a duplicate, fn is not called and the
// stored result is returned with processed false (nil if the ID was recorded
// without a result, by Process or by a Claim). An ID is a duplicate until
// its row is deleted, by [Store.Cleanup] or [Store.Forget]: a row past its
// expires_at that the cleaner has not deleted yet still gives its stored
// result, as [Store.Process] still skips it, and its fingerprint is still
// compared ([ErrPayloadMismatch]). While the first delivery is in flight, a
// duplicate waits for it, or returns [ErrInFlight] after
// [Config.LockTimeout]. A result longer than [Config.MaxResultBytes] (or
// [WithMaxResultBytes]) fails the call with [ErrResultTooLarge] and rolls
// everything back. Errors, panics, retries and opts are as in Process; it
// needs migration 00006.
//
// A new ID costs one round trip more than Process (the result's UPDATE); a
// duplicate costs the same.
func (s *Store) ProcessResult(ctx context.Context, messageID string, fn func(ctx context.Context, tx pgx.Tx) ([]byte, error), opts ...Option) (result []byte, processed bool, err error) {
	c, err := s.newIDClaim(messageID, opts)
	if err != nil {
		return nil, false, err
	}
	if fn == nil {
		return nil, false, errNilFunc
	}
	c.withResult = true
	limit, limitName := s.cfg.MaxResultBytes, "Config.MaxResultBytes"
	if c.opts.maxResultSet {
		limit, limitName = c.opts.maxResult, "WithMaxResultBytes"
	}
	store := func(ctx context.Context, tx pgx.Tx) error {
		res, err := fn(ctx, tx)
		if err != nil {
			return err
		}
		if len(res) > limit {
			return fmt.Errorf("%w: %s: %d bytes, more than %s (%d)", ErrResultTooLarge, c.subject(), len(res), limitName, limit)
		}
		if res != nil { // NULL already
			if err := s.storeResult(ctx, tx, c, res); err != nil {
				return err
			}
		}
		result = res
		return nil
	}
	// A duplicate's row can be deleted (by Cleanup once expired, by Forget)
	// between the claim and the read of its result: then the ID is claimed
	// again, as the new ID it has become.
	for range 3 {
		processed, err = s.process(ctx, c, store)
		if err != nil || processed || c.found {
			break
		}
	}
	switch {
	case err != nil:
		return nil, false, err
	case processed:
		return result, true, nil
	}
	return c.result, false, nil
}

// storeResult writes res into the row c claimed in tx.
func (s *Store) storeResult(ctx context.Context, tx pgx.Tx, c *idClaim, res []byte) error {
	l, err := s.layouts(ctx, pgxQueryRow(tx))
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	claimStatements{claim: []statement{l.messages.storeResult(c, res)}}.queue(b)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fromDatabase(fmt.Errorf("pgdedup: store the result of %s: %w", c.subject(), withDetail(err)))
	}
	return nil
}
