// Package shape holds what the engine in package pgdedup and the table's
// shapes and placements share. A shape is how the dedup table is laid out
// (package plain, package partitioned). A placement is where it lives (one
// server, or a Citus cluster in package citus). The engine asks a [Shape]
// for the statements of a claim and sends them. This package imports no
// other package of pgdedup.
package shape

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what a shape calls on Postgres. A *pgxpool.Pool, a *pgx.Conn and
// the Store's DB satisfy it.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Env is what a shape is built from: the database, the table's names and
// the Store's settings.
type Env struct {
	DB  DB
	Log *slog.Logger
	// Table is the quoted, possibly schema-qualified dedup table.
	Table string
	// Retention is Config.Retention.
	Retention time.Duration
	// CleanupBatchSize is Config.CleanupBatchSize.
	CleanupBatchSize int64
	// LockTimeoutMS is Config.LockTimeout in milliseconds, rounded up. Zero
	// means none.
	LockTimeoutMS int64
}

// Statement is one SQL statement of a claim and what reads its answer.
type Statement struct {
	SQL  string
	Args []any
	// Row, when set, is called for each row the statement returns with a
	// function that scans it.
	Row RowFunc
	// Affected, when set, is called with the number of rows the statement
	// inserted, updated or deleted.
	Affected func(n int64)
}

// RowFunc reads one row of a statement's answer with scan.
type RowFunc func(scan func(dest ...any) error) error

// Settings are transaction-local settings a claim runs with. Set goes
// before the claim and Restore after it, in the same transaction.
type Settings struct{ Set, Restore []string }

// Placement is where a table lives, as far as a claim of any kind cares.
type Placement interface {
	// Settings returns the transaction-local settings a claim runs with.
	// A batch may need more than a claim of one ID.
	Settings(batch bool) Settings
	// Transient marks err as one a new transaction can cure, where the
	// placement knows more than pgdedup.IsTransient. Other errors come back
	// as they are.
	Transient(err error) error
}

// ID is one message ID of a consumer, with its key.
type ID struct{ Consumer, ID, Key string }

// Args are the arguments every statement on one ID takes: $1 consumer, $2
// id, $3 key.
func (i ID) Args() []any { return []any{i.Consumer, i.ID, i.Key} }

// One is the claim of one ID, with its options.
type One struct {
	ID
	Retention   time.Duration // zero means the Store's
	Fingerprint []byte        // nil means none
	WithResult  bool          // read the stored result back
	// Claimed is set to whether the claim inserted the ID.
	Claimed *bool
	// Stored reads the SELECT that follows a claim with a fingerprint or for
	// a result.
	Stored RowFunc
	// Since, when not zero, is the earliest time any claim of the ID can
	// have been made: the message's first sending, less a margin. A shape
	// may look for the ID only in what was claimed from then on.
	Since time.Time
	// Missed, when set, lets a shape answer with a claim that guesses from
	// the client's clock. The shape sets it when the guess was wrong, having
	// written nothing. The caller then sends the claim again, in the same
	// transaction, with Tried one more. Tried is how many claims of the ID
	// missed so far. A shape guesses less with each.
	Missed *bool
	Tried  int
	// Wrote, when set, lets a guess that missed have written one row of
	// the ID after all: the shape sets *Wrote to its processed_at, and sets
	// Missed. The claim sent again then gets it as Undo.
	Wrote *time.Time
	// Undo, when not zero, is the processed_at of the row a missed guess
	// wrote in this transaction (see Wrote). The claim deletes it first.
	Undo time.Time
}

// Many is the claim of a batch of IDs, sorted by key, each once.
type Many struct {
	Consumer  string
	IDs, Keys []string
	// Fresh reads each ID the claim inserted.
	Fresh RowFunc
	// Missed is as One's: when set, the shape may guess from the client's
	// clock, and sets it when the guess was wrong, having written nothing.
	Missed *bool
	// Since is as One's, for every ID of the batch; it counts only with
	// Missed set.
	Since time.Time
}

// Shape is how the dedup table is laid out, on its placement.
type Shape interface {
	Placement
	// ClaimOne returns the statements claiming c's ID. They set *c.Claimed
	// and read what c needs of the ID's row.
	ClaimOne(c One) []Statement
	// StoreResult returns the statement storing result in the row of id.
	StoreResult(id ID, result []byte) Statement
	// ClaimMany returns the statements claiming c's IDs. They read the new
	// ones with c.Fresh.
	ClaimMany(c Many) []Statement
	// Lookup returns the statement reading the row of id with row.
	Lookup(id ID, row RowFunc) Statement
	// Delete returns the statement deleting the rows of id, for Forget.
	Delete(id ID, affected func(n int64)) Statement
	// Cleanup forgets expired IDs (see Store.Cleanup). Skipped reports that
	// it never had the cleaners' turn, because another cleaner held it.
	Cleanup(ctx context.Context, r *Report) (deleted int64, skipped bool, err error)
	// Sizes fills in what the shape can say of the table's storage.
	Sizes(ctx context.Context, st *Sizes) error
}

// Report is what one cleanup did besides deleting rows. Created and Dropped
// stay nil on a table without partitions.
type Report struct {
	Created, Dropped []Span
}

// Span is one partition that a cleanup created or dropped.
type Span struct {
	Name     string
	From, To time.Time
}

// Sizes are the parts of pgdedup.Stats that depend on the shape. Now is the
// database's clock, read before.
type Sizes struct {
	Now                                time.Time
	TableBytes, IndexBytes, TotalBytes int64
	DeadTuples                         int64
	LastVacuum, LastAutovacuum         *time.Time
	Indexes                            []IndexSize
	PartitionSpan                      time.Duration
	SealedBefore                       *time.Time
	Partitions                         []PartitionSize
	PartitionRunway                    *time.Duration
}

// IndexSize is one index of the table.
type IndexSize struct {
	Name   string
	Method string
	Bytes  int64
}

// PartitionSize is one partition of the table.
type PartitionSize struct {
	Name              string
	From, To          time.Time
	Sealed, Detaching bool
	Rows, Bytes       int64
}

// ErrCleanupStarved is pgdedup.ErrCleanupStarved: see there.
var ErrCleanupStarved = errors.New("pgdedup: cleanup never got its turn")

// CurableError marks an error of pgdedup's own claim that a later attempt
// cures once something outside the message changes. pgdedup.ActionFor
// answers ActionRequeue for it. Its message is the error's own.
type CurableError struct{ Err error }

// Error returns the error's own message.
func (e *CurableError) Error() string { return e.Err.Error() }

// Unwrap returns the error.
func (e *CurableError) Unwrap() error { return e.Err }

// ConnLostError marks an error as the loss of the connection to the
// database. pgdedup.IsTransient cannot tell it from other network errors by
// type alone. Its message is the error's own.
type ConnLostError struct{ Err error }

// Error returns the error's own message.
func (e *ConnLostError) Error() string { return e.Err.Error() }

// Unwrap returns the error.
func (e *ConnLostError) Unwrap() error { return e.Err }

// detailError adds the server's DETAIL and HINT to the message of a
// *pgconn.PgError. Its Error method leaves them out, although they often
// say what went wrong. errors.As still finds the *pgconn.PgError.
type detailError struct {
	err  error
	text string
}

func (e *detailError) Error() string { return e.err.Error() + e.text }
func (e *detailError) Unwrap() error { return e.err }

// WithDetail returns err with the DETAIL and HINT of the *pgconn.PgError it
// wraps added to its message. Other errors come back as they are.
func WithDetail(err error) error {
	var pgErr *pgconn.PgError
	var done *detailError
	if err == nil || errors.As(err, &done) || !errors.As(err, &pgErr) || pgErr.Detail == "" && pgErr.Hint == "" {
		return err
	}
	text := ""
	if pgErr.Detail != "" {
		text += "; DETAIL: " + pgErr.Detail
	}
	if pgErr.Hint != "" {
		text += "; HINT: " + pgErr.Hint
	}
	return &detailError{err: err, text: text}
}

// SQLState returns the SQLSTATE err carries, from pgx or from a
// database/sql driver's error type with a SQLState method.
func SQLState(err error) (string, bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code, true
	}
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		return st.SQLState(), true
	}
	return "", false
}

// IsCode reports whether err is a database error of SQLSTATE code.
func IsCode(err error, code string) bool {
	c, _ := SQLState(err)
	return err != nil && c == code
}

// QuoteLiteral quotes s as an SQL string literal, whatever
// standard_conforming_strings is.
func QuoteLiteral(s string) string {
	s = strings.ReplaceAll(s, `'`, `''`)
	if strings.Contains(s, `\`) {
		return `E'` + strings.ReplaceAll(s, `\`, `\\`) + `'`
	}
	return `'` + s + `'`
}

// Jitter returns d ±10%, uniformly.
func Jitter(d time.Duration) time.Duration {
	spread := d / 5
	if spread <= 0 {
		return d
	}
	return d - spread/2 + rand.N(spread)
}

// Exec runs one statement on db and discards its rows.
func Exec(ctx context.Context, db DB, sql string, args ...any) error {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// Ptr returns a pointer to a copy of v.
func Ptr[T any](v T) *T { return &v }

// CleanupLockClass is the first half of the cleaners' advisory lock key
// ("pgdd" in ASCII). The second is the table's OID. So cleaners of
// different tables never take turns.
const CleanupLockClass = "1885824100"

// CleanupTurnSetting holds whether a cleanup batch got the turn, until its
// transaction ends (set_config's is_local).
const CleanupTurnSetting = "pgdedup.cleanup_turn"
