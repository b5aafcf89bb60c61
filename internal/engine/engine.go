// Package engine is the one path every claim takes. A claim is a single ID,
// a batch of IDs or a topic partition's offsets. It runs in a transaction
// the engine begins, in the caller's pgx transaction, or in the caller's
// database/sql transaction.
//
// A kind of claim only says which statements to send and what their answer
// means (see [Claim]). The table's shape says how they are written where the
// table lives. Sending, reading, in-flight and duplicate handling, fn,
// COMMIT, retries, error wrapping, logs and events are written here once.
package engine

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// The errors a claim can end in. Package pgdedup exports them under the
// same names.
var (
	ErrInFlight        = errors.New("pgdedup: message is being processed by another transaction")
	ErrFenced          = errors.New("pgdedup: partition is held by a newer generation")
	ErrPayloadMismatch = errors.New("pgdedup: message ID reused with a different payload")

	errNilTx = errors.New("pgdedup: tx must not be nil")
)

// EventKind says what an [Event] reports. Its values are those of
// pgdedup.EventKind.
type EventKind int

// The outcomes the engine reports.
const (
	EventProcessed       EventKind = 1
	EventDuplicate       EventKind = 2
	EventRetry           EventKind = 3
	EventInFlight        EventKind = 4
	EventPayloadMismatch EventKind = 6
)

// Event is one outcome of a claim, as pgdedup.Event reports it.
type Event struct {
	Kind      EventKind
	MessageID string
	Count     int64
	Attempt   int
	Duration  time.Duration
	Err       error
}

// QueryRow runs one single-row query and scans it. It wraps pgx's QueryRow
// on a pool, a transaction or a connection, or database/sql's
// QueryRowContext.
type QueryRow func(ctx context.Context, sql string, args []any, dest ...any) error

// PgxQueryRow is q's QueryRow as a [QueryRow].
func PgxQueryRow(q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) QueryRow {
	return func(ctx context.Context, sql string, args []any, dest ...any) error {
		return q.QueryRow(ctx, sql, args...).Scan(dest...)
	}
}

func sqlQueryRow(tx *sql.Tx) QueryRow {
	return func(ctx context.Context, sql string, args []any, dest ...any) error {
		return tx.QueryRowContext(ctx, sql, args...).Scan(dest...)
	}
}

// Engine sends claims for one consumer. It is built once per Store.
type Engine struct {
	DB          shape.DB
	Consumer    string
	TxOptions   pgx.TxOptions
	MaxAttempts int
	Log         *slog.Logger
	// Emit reports an event. It is never nil.
	Emit func(ctx context.Context, e Event)
	// Layouts returns the shapes of the two tables, looking them up with q
	// when they are not known yet.
	Layouts func(ctx context.Context, q QueryRow) (*Layouts, error)
	// Table is the quoted dedup table, for error messages.
	Table string
	// Offsets is the SQL for the offset table.
	Offsets OffsetSQL
	// LockTimeoutMS is Config.LockTimeout in milliseconds, or 0 for none.
	LockTimeoutMS int64
}

// ClaimIn runs c in tx, the caller's pgx transaction. It costs one round
// trip. It never retries, since retrying is the business of whoever owns tx.
func (e *Engine) ClaimIn(ctx context.Context, tx pgx.Tx, c Claim) error {
	if tx == nil {
		return errNilTx
	}
	l, err := e.Layouts(ctx, PgxQueryRow(tx))
	if err != nil {
		return err
	}
	return e.done(ctx, c, l, sendAgain(ctx, tx, c, l, sendIn(ctx, tx, c, l)))
}

// sendIn sends c's statements on tx.
func sendIn(ctx context.Context, tx pgx.Tx, c Claim, l *Layouts) error {
	b := &pgx.Batch{}
	queue(b, c.Statements(l))
	return tx.SendBatch(ctx, b).Close()
}

// missed reports whether c's statements just missed (see IDClaim.Missed).
func missed(c Claim) bool {
	m, ok := c.(interface{ Missed() bool })
	return ok && m.Missed()
}

// sendAgain sends c's statements again on tx while the last send, whose
// error is err, missed. Each costs a round trip. A claim guesses twice at
// most, and the guesses are seldom wrong (see shape.One.Missed).
func sendAgain(ctx context.Context, tx pgx.Tx, c Claim, l *Layouts, err error) error {
	for err == nil && missed(c) {
		err = sendIn(ctx, tx, c, l)
	}
	return err
}

// ClaimInSQL runs c in tx, the caller's database/sql transaction. It never
// retries.
func (e *Engine) ClaimInSQL(ctx context.Context, tx *sql.Tx, c Claim) error {
	if tx == nil {
		return errNilTx
	}
	l, err := e.Layouts(ctx, sqlQueryRow(tx))
	if err != nil {
		return err
	}
	err = runSQL(ctx, tx, c.Statements(l))
	for err == nil && missed(c) {
		err = runSQL(ctx, tx, c.Statements(l))
	}
	return e.done(ctx, c, l, err)
}

// done turns the claim's answer into its outcome, its error, logs and
// events. It is the same for every kind of claim wherever it ran.
func (e *Engine) done(ctx context.Context, c Claim, l *Layouts, err error) error {
	if err != nil {
		err = e.claimError(c, l, err)
		if errors.Is(err, ErrInFlight) {
			e.Log.DebugContext(ctx, "pgdedup: in flight elsewhere", "consumer", e.Consumer, "claim", c.Subject())
			e.Emit(ctx, Event{Kind: EventInFlight, MessageID: c.MessageID(), Count: int64(c.Size())})
		}
		return err
	}
	_, skipped, err := c.Outcome()
	if err != nil {
		switch {
		case errors.Is(err, ErrFenced):
			e.Log.WarnContext(ctx, "pgdedup: fenced", "consumer", e.Consumer, "claim", c.Subject(), "error", err)
		case errors.Is(err, ErrPayloadMismatch):
			e.Log.WarnContext(ctx, "pgdedup: payload mismatch", "consumer", e.Consumer, "claim", c.Subject(), "error", err)
			e.Emit(ctx, Event{Kind: EventPayloadMismatch, MessageID: c.MessageID(), Count: 1, Err: err})
		}
		return err
	}
	if skipped > 0 {
		e.Log.DebugContext(ctx, "pgdedup: skipped duplicate", "consumer", e.Consumer, "claim", c.Subject(), "count", skipped)
		e.Emit(ctx, Event{Kind: EventDuplicate, MessageID: c.MessageID(), Count: int64(skipped)})
	}
	return nil
}

// claimError wraps err, the failure of c's statements. It names what was
// claimed and keeps the server's DETAIL. A lock timeout becomes ErrInFlight.
// A missing table says to run Migrate. A failure that a new transaction can
// cure is marked as such for IsTransient.
func (e *Engine) claimError(c Claim, l *Layouts, err error) error {
	err = shape.WithDetail(err)
	code, _ := shape.SQLState(err)
	switch {
	case code == "55P03" && e.LockTimeoutMS > 0:
		return fmt.Errorf("%w: %s: %w", ErrInFlight, c.Subject(), err)
	case code == "42P01":
		return fmt.Errorf("pgdedup: %s %s: %w (is %s or %s on the search_path? run pgdedup.Migrate or `pgdedup migrate up`)",
			action(c), c.Subject(), err, e.Table, e.Offsets.Table)
	}
	return l.Transient(fmt.Errorf("pgdedup: %s %s: %w", action(c), c.Subject(), err))
}

// action names what c's statements do, for error messages. It is "claim"
// unless c says otherwise, as Forget's "forget" does.
func action(c Claim) string {
	if a, ok := c.(interface{ Action() string }); ok {
		return a.Action()
	}
	return "claim"
}

// Apply runs c's statements in a transaction of their own and commits. It
// retries failures of the database. It serves statements that change rows
// without running fn, such as Forget's. BEGIN and the statements go in one
// round trip, and COMMIT in a second.
func (e *Engine) Apply(ctx context.Context, c Claim) error {
	return e.retry(ctx, c.MessageID(), func() error {
		l, err := e.Layouts(ctx, PgxQueryRow(e.DB))
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.BeginTx(e.TxOptions)
		queue(b, c.Statements(l))
		br := e.DB.SendBatch(ctx, b)
		tx := br.Tx()
		defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
		if err := sendAgain(ctx, tx, c, l, br.Close()); err != nil {
			return e.claimError(c, l, FromDatabase(err))
		}
		if _, _, err := c.Outcome(); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return l.Transient(FromDatabase(fmt.Errorf("pgdedup: commit %s %s: %w", action(c), c.Subject(), shape.WithDetail(err))))
		}
		return nil
	})
}

// Process runs fn for c's fresh items in a transaction that claims them, and
// commits. It retries failures of the database. It is the loop behind
// Process, ProcessBatch, ProcessResult and ProcessOffsets. BEGIN and the
// claim go in one round trip. It reports whether fn ran and committed.
func (e *Engine) Process(ctx context.Context, c Claim, fn func(ctx context.Context, tx pgx.Tx) error) (committed bool, err error) {
	err = e.retry(ctx, c.MessageID(), func() error {
		var err error
		committed, err = e.processOnce(ctx, c, fn)
		return err
	})
	return committed, err
}

func (e *Engine) processOnce(ctx context.Context, c Claim, fn func(ctx context.Context, tx pgx.Tx) error) (bool, error) {
	start := time.Now()
	l, err := e.Layouts(ctx, PgxQueryRow(e.DB))
	if err != nil {
		return false, err
	}
	b := &pgx.Batch{}
	b.BeginTx(e.TxOptions)
	queue(b, c.Statements(l))
	br := e.DB.SendBatch(ctx, b)
	tx := br.Tx()
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit, and pgx closes the connection on failure

	if err := e.done(ctx, c, l, sendAgain(ctx, tx, c, l, br.Close())); err != nil {
		return false, err
	}
	fresh, _, _ := c.Outcome()
	if fresh == 0 {
		return false, tx.Rollback(ctx)
	}
	if err := fn(ctx, tx); err != nil {
		return false, fromFn(tx, l, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, l.Transient(FromDatabase(fmt.Errorf("pgdedup: commit %s: %w", c.Subject(), shape.WithDetail(err))))
	}
	e.Emit(ctx, Event{Kind: EventProcessed, MessageID: c.MessageID(), Count: int64(fresh), Duration: time.Since(start)})
	return true, nil
}

// retry runs attempt until it succeeds, fails for good, MaxAttempts is
// reached or ctx is done. It sleeps a jittered, growing backoff in between.
// Only failures of the database are retried (see IsTransient). attempt marks
// the errors of its own statements with FromDatabase, and fn's errors with
// fromFn's verdict on pgdedup's own transaction.
func (e *Engine) retry(ctx context.Context, id string, attempt func() error) error {
	for n := 1; ; n++ {
		err := attempt()
		if err == nil || n >= e.MaxAttempts || ctx.Err() != nil || !IsTransient(err) {
			return err
		}
		e.Log.WarnContext(ctx, "pgdedup: retrying after transient failure",
			"consumer", e.Consumer, "message_id", id, "attempt", n, "error", err)
		e.Emit(ctx, Event{Kind: EventRetry, MessageID: id, Attempt: n, Err: err})
		t := time.NewTimer(backoff(n))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// backoff returns the pause after failed attempt n, counted from 1. It starts
// at 10ms and doubles up to 1s. Its upper half is jittered, so that
// colliding consumers spread.
func backoff(n int) time.Duration {
	d := min(10*time.Millisecond<<min(n-1, 7), time.Second)
	return d/2 + rand.N(d/2)
}
