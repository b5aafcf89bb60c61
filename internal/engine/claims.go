package engine

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// Claim is one kind of claim, for one call. It gives the statements that
// claim its items and, once they have run, its outcome.
type Claim interface {
	// Statements returns what to send on l, in order. Their callbacks record
	// the outcome in the claim, which starts afresh with each call.
	Statements(l *Layouts) Statements
	// Outcome reads the result after the statements ran. It says how many
	// items were new, and how many were skipped as already claimed. An error
	// here, such as a fenced partition, fails the claim.
	Outcome() (fresh, skipped int, err error)
	// Subject names what is claimed, for error messages. Examples are
	// `"order-1"`, "batch of 3 IDs" and "orders partition 2 offsets 5-9".
	Subject() string
	// MessageID is the ID of a single-ID claim, for logs and events. It is
	// empty for batches and offsets.
	MessageID() string
	// Size is how many items the claim claims (distinct IDs, offsets).
	Size() int
}

// Layouts are the shapes of a Store's two tables, as the engine sends
// claims to them.
type Layouts struct {
	Messages shape.Shape     // Config.Table
	Offsets  shape.Placement // Config.OffsetTable
}

// Transient marks err as transient if either table's placement says so.
func (l *Layouts) Transient(err error) error {
	return l.Offsets.Transient(l.Messages.Transient(err))
}

// IDClaim claims one message ID.
type IDClaim struct {
	ID          shape.ID
	Retention   time.Duration // zero means Config.Retention
	Fingerprint []byte        // nil means none
	WithResult  bool          // read the stored result back, for ProcessResult
	// Mismatch returns the error of a duplicate whose stored fingerprint
	// differs from Fingerprint.
	Mismatch func(stored []byte) error

	// Since, when not zero, is the earliest time a claim of the ID can have
	// been made (shape.One.Since).
	Since time.Time

	Claimed bool   // the claim inserted the ID
	Found   bool   // the SELECT after the claim found the ID's row
	Stored  []byte // the fingerprint read after the claim
	Result  []byte // the result read after the claim (WithResult)

	// missed is set by a claim whose guess the database refuted, and tried
	// counts them (see Missed). A claim that must not miss starts at
	// noGuess.
	missed bool
	tried  int
	// wrote is the processed_at of a row that the last send's missed guess
	// wrote (shape.One.Wrote), and undo that of the send before, which the
	// next send deletes first (shape.One.Undo).
	wrote, undo time.Time
}

// noGuess is the tries after which a claim no longer guesses: a lean guess,
// then one bounded by the client's clock, then none.
const noGuess = 2

// Statements implements [Claim].
func (c *IDClaim) Statements(l *Layouts) Statements {
	c.Claimed, c.Found, c.Stored, c.Result = false, false, nil, nil
	o := c.One()
	c.undo, c.wrote = time.Time{}, time.Time{}
	return Statements{Settings: l.Messages.Settings(false), Claim: l.Messages.ClaimOne(o)}
}

// One is the shape's view of c. Its callbacks fill in c.
func (c *IDClaim) One() shape.One {
	o := shape.One{ID: c.ID, Retention: c.Retention, Fingerprint: c.Fingerprint,
		WithResult: c.WithResult, Claimed: &c.Claimed, Stored: c.scanStored, Wrote: &c.wrote, Undo: c.undo}
	if c.tried < noGuess {
		o.Since, o.Missed, o.Tried = c.Since, &c.missed, c.tried
	}
	return o
}

// Missed reports whether the statements just sent missed: the database
// refuted the shape's guess (shape.One.Missed), and nothing was written.
// The statements are then due again, in the same transaction, guessing
// less.
func (c *IDClaim) Missed() bool {
	if !c.missed {
		return false
	}
	c.missed = false
	c.tried++
	c.undo = c.wrote
	return true
}

// scanStored is the row callback of the SELECT after a claim with a
// fingerprint or for a result.
func (c *IDClaim) scanStored(scan func(dest ...any) error) error {
	c.Found = true
	if c.WithResult {
		return scan(&c.Stored, &c.Result)
	}
	return scan(&c.Stored)
}

// Outcome tells a mismatch from a duplicate. A duplicate whose recorded
// fingerprint differs from the given one is a mismatch. A row without a
// fingerprint has nothing to compare. A row past expires_at that is not
// deleted yet is compared as any other. It is the ID's record until it is
// deleted.
func (c *IDClaim) Outcome() (fresh, skipped int, err error) {
	switch {
	case c.Claimed:
		return 1, 0, nil
	case c.Fingerprint != nil && c.Stored != nil && !bytes.Equal(c.Stored, c.Fingerprint):
		return 0, 0, c.Mismatch(c.Stored)
	}
	return 0, 1, nil
}

func (c *IDClaim) Subject() string   { return strconv.Quote(c.ID.ID) }
func (c *IDClaim) MessageID() string { return c.ID.ID }
func (c *IDClaim) Size() int         { return 1 }

// StoreResult writes res into the row c claimed in tx.
func (e *Engine) StoreResult(ctx context.Context, tx pgx.Tx, c *IDClaim, res []byte) error {
	l, err := e.Layouts(ctx, PgxQueryRow(tx))
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	queue(b, Statements{Claim: []shape.Statement{l.Messages.StoreResult(c.ID, res)}})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return FromDatabase(fmt.Errorf("pgdedup: store the result of %s: %w", c.Subject(), shape.WithDetail(err)))
	}
	return nil
}

// BatchClaim claims a batch of message IDs.
type BatchClaim struct {
	Consumer string
	IDs      []string // as the caller gave them
	// Sorted are the valid IDs, each once, in key order. Keys[i] is the key
	// of Sorted[i].
	Sorted, Keys []string
	// Since, when not zero, is the earliest time a claim of any of the IDs
	// can have been made (shape.Many.Since).
	Since time.Time
	fresh map[string]struct{}
	// missed is set by a claim whose guess the database refuted. A batch
	// guesses once (see Missed).
	missed, guessed bool
}

// Statements implements [Claim].
func (c *BatchClaim) Statements(l *Layouts) Statements {
	c.fresh = make(map[string]struct{}, len(c.Sorted))
	m := shape.Many{Consumer: c.Consumer, IDs: c.Sorted, Keys: c.Keys, Fresh: c.addFresh}
	if !c.guessed {
		m.Missed, m.Since = &c.missed, c.Since
	}
	return Statements{Settings: l.Messages.Settings(true), Claim: l.Messages.ClaimMany(m)}
}

// Missed is as IDClaim's. A batch's second claim does not guess.
func (c *BatchClaim) Missed() bool {
	if !c.missed {
		return false
	}
	c.missed, c.guessed = false, true
	return true
}

// addFresh is the row callback of a batch claim's statements. They return
// the IDs they inserted.
func (c *BatchClaim) addFresh(scan func(dest ...any) error) error {
	var id string
	if err := scan(&id); err != nil {
		return err
	}
	c.fresh[id] = struct{}{}
	return nil
}

func (c *BatchClaim) Outcome() (fresh, skipped int, err error) {
	return len(c.fresh), len(c.Sorted) - len(c.fresh), nil
}

func (c *BatchClaim) Subject() string   { return fmt.Sprintf("batch of %d IDs", len(c.Sorted)) }
func (c *BatchClaim) MessageID() string { return "" }
func (c *BatchClaim) Size() int         { return len(c.Sorted) }

// FreshIDs returns the new IDs in the order they first appear in the
// caller's batch, each once.
func (c *BatchClaim) FreshIDs() []string {
	if len(c.fresh) == 0 {
		return nil
	}
	seen := make(map[string]struct{}, len(c.fresh))
	out := make([]string, 0, len(c.fresh))
	for _, id := range c.IDs {
		if _, ok := c.fresh[id]; ok {
			if _, dup := seen[id]; !dup {
				seen[id] = struct{}{}
				out = append(out, id)
			}
		}
	}
	return out
}

// ForgetClaim is the kind of claim that Forget runs.
//
// First comes the shape's own claim of the ID. It waits for a transaction
// that holds the ID (a first delivery in flight) to end. It gives up after
// Config.LockTimeout, exactly as a claim would. A plain DELETE would not see
// that transaction's uncommitted row. It would delete nothing and let a
// redelivery run beside it. The DELETE follows as a statement of its own,
// with a snapshot taken after the wait. It removes the ID's rows, committed
// or just claimed. There was a row only if the claim found the ID already
// claimed.
type ForgetClaim struct {
	ID    shape.ID
	Found bool // there was a row to forget
	claim IDClaim
}

// Statements implements [Claim].
func (c *ForgetClaim) Statements(l *Layouts) Statements {
	// Forget's DELETE follows the claim in the same round trip, so the
	// claim must not miss (see IDClaim.Missed).
	c.Found, c.claim = false, IDClaim{ID: c.ID, tried: noGuess}
	del := l.Messages.Delete(c.ID, func(n int64) { c.Found = n > 0 && !c.claim.Claimed })
	return Statements{Settings: l.Messages.Settings(false), Claim: append(l.Messages.ClaimOne(c.claim.One()), del)}
}

func (c *ForgetClaim) Outcome() (int, int, error) { return 0, 0, nil }
func (c *ForgetClaim) Subject() string            { return strconv.Quote(c.ID.ID) }
func (c *ForgetClaim) MessageID() string          { return c.ID.ID }
func (c *ForgetClaim) Size() int                  { return 1 }
func (c *ForgetClaim) Action() string             { return "forget" }

// Lookup reads the committed row of id in one round trip. found is false
// when there is none.
func (e *Engine) Lookup(ctx context.Context, id shape.ID) (processedAt, expiresAt time.Time, found bool, err error) {
	r := &lookupRow{id: id.ID}
	l, err := e.Layouts(ctx, PgxQueryRow(e.DB))
	if err != nil {
		return time.Time{}, time.Time{}, false, err
	}
	b := &pgx.Batch{}
	queue(b, Statements{Claim: []shape.Statement{l.Messages.Lookup(id, r.scan)}})
	if err := e.DB.SendBatch(ctx, b).Close(); err != nil {
		return time.Time{}, time.Time{}, false, e.claimError(r, l, FromDatabase(err))
	}
	return r.processedAt, r.expiresAt, r.found, nil
}

// lookupRow is one Lookup, with the ID and what its statement read.
type lookupRow struct {
	id                     string
	processedAt, expiresAt time.Time
	found                  bool
}

func (r *lookupRow) scan(scan func(dest ...any) error) error {
	r.found = true
	return scan(&r.processedAt, &r.expiresAt)
}

// lookupRow is a claim for claimError's sake alone, which words its errors.
func (r *lookupRow) Statements(*Layouts) Statements { return Statements{} }
func (r *lookupRow) Outcome() (int, int, error)     { return 0, 0, nil }
func (r *lookupRow) Subject() string                { return strconv.Quote(r.id) }
func (r *lookupRow) MessageID() string              { return r.id }
func (r *lookupRow) Size() int                      { return 1 }
func (r *lookupRow) Action() string                 { return "look up" }
