package pgdedup

import (
	"context"
	"time"

	"github.com/pgdedup/pgdedup/internal/engine"
)

// Record is what the dedup table holds for one message ID of a consumer,
// as [Store.Lookup] reads it.
type Record struct {
	ProcessedAt time.Time // when the claim that recorded the ID was made
	// ExpiresAt is when [Store.Cleanup] may delete the row. Until a cleanup
	// does, the ID still counts as processed, even past ExpiresAt.
	ExpiresAt time.Time
}

// Lookup reports whether messageID is recorded for the [Store]'s consumer,
// and if so when it was processed and when it expires. It reads committed
// rows only, so an ID whose first delivery is still in flight reads as not
// recorded. It costs one round trip and validates messageID first
// ([ErrInvalidMessageID]).
func (s *Store) Lookup(ctx context.Context, messageID string) (rec Record, recorded bool, err error) {
	if err := ValidateMessageID(messageID); err != nil {
		return Record{}, false, err
	}
	processedAt, expiresAt, found, err := s.eng.Lookup(ctx, s.id(messageID))
	return Record{ProcessedAt: processedAt, ExpiresAt: expiresAt}, found, err
}

// Forget deletes the row recording messageID for the [Store]'s consumer and
// reports whether there was one. The next delivery of messageID is then
// processed again. Use it to let a message through on purpose, after fixing a
// handler that wrongly succeeded. Forgetting re-opens the door to exactly the
// duplicate the table exists to stop.
//
// A first delivery still in flight is never run beside another. Forget waits
// for its transaction to end and then deletes the row it committed. With
// [Config.LockTimeout] it returns [ErrInFlight] after that long instead.
// Failures of the database are retried as in [Store.Process]. After a COMMIT
// whose outcome was unknown, the retry may report false for a row this call
// deleted.
func (s *Store) Forget(ctx context.Context, messageID string) (forgotten bool, err error) {
	if err := ValidateMessageID(messageID); err != nil {
		return false, err
	}
	c := &engine.ForgetClaim{ID: s.id(messageID)}
	if err := s.eng.Apply(ctx, c); err != nil {
		return false, err
	}
	return c.Found, nil
}
