package pgdedup

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
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
	r := &lookupRow{store: s, id: messageID}
	l, err := s.layouts(ctx, pgxQueryRow(s.db))
	if err != nil {
		return Record{}, false, err
	}
	b := &pgx.Batch{}
	claimStatements{claim: []statement{l.messages.lookup(r)}}.queue(b)
	if err := s.db.SendBatch(ctx, b).Close(); err != nil {
		return Record{}, false, s.claimError(r, l, fromDatabase(err))
	}
	return r.rec, r.found, nil
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
	c := &forgetClaim{store: s, id: messageID}
	if err := s.apply(ctx, c); err != nil {
		return false, err
	}
	return c.found, nil
}

// lookupRow is one Lookup, with the ID and what its statement read.
type lookupRow struct {
	store *Store
	id    string
	rec   Record
	found bool
}

func (r *lookupRow) scan(scan func(dest ...any) error) error {
	r.found = true
	return scan(&r.rec.ProcessedAt, &r.rec.ExpiresAt)
}

// lookupRow is a claim for claimError's sake alone, which words its errors.
func (r *lookupRow) statements(*layouts) claimStatements { return claimStatements{} }
func (r *lookupRow) outcome() (int, int, error)          { return 0, 0, nil }
func (r *lookupRow) subject() string                     { return strconv.Quote(r.id) }
func (r *lookupRow) messageID() string                   { return r.id }
func (r *lookupRow) size() int                           { return 1 }
func (r *lookupRow) action() string                      { return "look up" }

// forgetClaim is the kind of claim that Forget runs. Its statements are the
// layout's forget statements, which wait for a transaction holding the ID as
// a claim does.
type forgetClaim struct {
	store *Store
	id    string
	claim idClaim // the claim that waits, new (claimed) if the ID had no row
	found bool
}

func (c *forgetClaim) statements(l *layouts) claimStatements {
	c.found = false
	return claimStatements{settings: l.messages.settings(false), claim: l.messages.forget(c)}
}

func (c *forgetClaim) outcome() (int, int, error) { return 0, 0, nil }
func (c *forgetClaim) subject() string            { return strconv.Quote(c.id) }
func (c *forgetClaim) messageID() string          { return c.id }
func (c *forgetClaim) size() int                  { return 1 }
func (c *forgetClaim) action() string             { return "forget" }
