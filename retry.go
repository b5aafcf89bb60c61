package pgdedup

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// retry runs attempt until it succeeds, fails permanently, MaxAttempts is
// reached or ctx is done, sleeping a jittered, growing backoff in between.
// Only failures of the database are retried (see IsTransient). attempt marks
// the errors of its own statements with fromDatabase, and fn's errors with
// fromFn's verdict on pgdedup's own transaction.
func (s *Store) retry(ctx context.Context, id string, attempt func() error) error {
	for n := 1; ; n++ {
		err := attempt()
		if err == nil || n >= s.cfg.MaxAttempts || ctx.Err() != nil || !IsTransient(err) {
			return err
		}
		s.log.WarnContext(ctx, "pgdedup: retrying after transient failure",
			"consumer", s.cfg.Consumer, "message_id", id, "attempt", n, "error", err)
		s.emit(ctx, Event{Kind: EventRetry, MessageID: id, Attempt: n, Err: err})
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
// at 10ms and doubles up to 1s, with full jitter in its upper half so that
// colliding consumers spread.
func backoff(n int) time.Duration {
	d := min(10*time.Millisecond<<min(n-1, 7), time.Second)
	return d/2 + rand.N(d/2)
}

// IsTransient reports whether err is a failure of the database that trying
// again can cure.
//
// Take first an error returned by [Store.Process], [Store.ProcessBatch],
// [Store.ProcessOffsets], [Store.ProcessOffset] or [Store.ProcessResult]
// after fn failed. IsTransient answers true only when pgdedup's own
// transaction failed under fn. Its connection was lost, or a serialization
// failure or deadlock aborted it (or, on Citus, a worker's connection
// failure). These calls retried such a failure up to [Config.MaxAttempts]
// times already. Any other error comes back as fn returned it, after one
// attempt, and IsTransient answers false for it, whatever its type or
// SQLSTATE. Examples are a second database connection's error, a payment
// gateway's error carrying SQLSTATE 40001, and an HTTP client's error.
// pgdedup cannot know whether that other system acted on the request. So
// whether to requeue is the caller's decision, made by inspecting the error
// with errors.As.
//
// For any other error, such as one of the caller's own statements or of
// [Store.Claim] in the caller's transaction, it answers true in three cases.
//
//   - The error carries one of these SQLSTATEs, from pgx's *pgconn.PgError or
//     from a database/sql driver whose error has a SQLState() string method
//     (lib/pq, pgx's stdlib). They are serialization failure 40001, deadlock
//     40P01, admin or crash shutdown 57P01 and 57P02, cannot connect now
//     57P03, and the connection exceptions of class 08.
//   - The connection to the database was lost under a statement that pgdedup
//     sent. pgdedup marks those errors itself.
//   - A connection could not be opened (*pgconn.ConnectError), pgx reports the
//     error as safe to retry because nothing was sent, or the error is
//     database/sql's driver.ErrBadConn.
//
// It answers false for everything else. That includes io.EOF, a reset
// connection and any other network error that pgdedup did not mark as its own
// connection's loss. An HTTP client's error or a decoder's io.EOF is not
// transient, because pgdedup cannot know whether the other side acted on the
// request. Context cancellation is never transient. It never reads an error's
// message text.
//
// A consumer can use it to decide between requeueing a message (true) and
// dead-lettering it.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var fnErr *fnError
	if errors.As(err, &fnErr) {
		return fnErr.transient
	}
	var lost *connLostError
	if errors.As(err, &lost) {
		return true
	}
	if code, ok := sqlState(err); ok {
		return transientSQLState(code)
	}
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr) || pgconn.SafeToRetry(err) || errors.Is(err, driver.ErrBadConn)
}

// transientSQLState reports whether a SQLSTATE is one IsTransient retries.
func transientSQLState(code string) bool {
	switch code {
	case "40001", // serialization_failure
		"40P01", // deadlock_detected
		"57P01", // admin_shutdown
		"57P02", // crash_shutdown
		"57P03": // cannot_connect_now
		return true
	}
	return strings.HasPrefix(code, "08") // connection_exception
}

// sqlState returns the SQLSTATE err carries, from pgx or from a database/sql
// driver's error type with a SQLState method.
func sqlState(err error) (string, bool) { return shape.SQLState(err) }

// connLostError marks an error as the loss of the connection to the
// database, which IsTransient cannot tell from other network errors by type
// alone. Its message is the error's own.
type connLostError = shape.ConnLostError

// fromDatabase marks err, returned by a statement pgdedup sent itself (BEGIN,
// a claim, COMMIT), as a lost connection when it is a network failure rather
// than an answer of the server. Such an error can only have come from the
// database connection.
func fromDatabase(err error) error {
	if err == nil || !isNetworkFailure(err) {
		return err
	}
	return &connLostError{Err: err}
}

// fnError is an error fn returned, with pgdedup's verdict on it. It is
// transient when pgdedup's own transaction failed under fn, so that a new
// attempt can cure it. IsTransient reads the verdict and nothing else of err.
// An error from another system keeps its own SQLSTATE and type, but pgdedup
// does not call it transient. Its message is err's own.
type fnError struct {
	err       error
	transient bool
}

func (e *fnError) Error() string { return e.err.Error() }
func (e *fnError) Unwrap() error { return e.err }

// fromFn returns err, returned by fn, with the verdict of whether tx,
// pgdedup's own transaction, failed. tx failed when its connection is closed,
// which pgx does when the connection fails. tx also failed when it is aborted
// on the server (transaction status 'E') and err carries the failure the
// server reported to a pgx statement of tx. That is a *pgconn.PgError with a
// SQLSTATE that IsTransient retries (40001, 40P01, or a connection exception
// such as 08006 for a Citus worker lost under the statement), or an error that
// l's placement knows a new transaction cures. Any other error did not come
// from tx, whatever its type or SQLSTATE. It may be another connection's
// error, an HTTP call's or a decoder's. It is returned after one attempt and
// not called transient. Cancellation is left as it is.
func fromFn(tx pgx.Tx, l *layouts, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	c := tx.Conn()
	if c == nil {
		return &fnError{err: err}
	}
	if c.IsClosed() {
		return &fnError{err: err, transient: true}
	}
	if c.PgConn().TxStatus() != 'E' {
		return &fnError{err: err}
	}
	err = l.transient(err) // a partitioned table's advice, or Citus's XX000
	if _, lost := err.(*connLostError); lost {
		return &fnError{err: err, transient: true}
	}
	var pgErr *pgconn.PgError
	aborted := errors.As(err, &pgErr) && transientSQLState(pgErr.Code)
	return &fnError{err: err, transient: aborted}
}

// isNetworkFailure reports whether err is a transport failure (not an answer
// of the server, not a cancellation).
func isNetworkFailure(err error) bool {
	if _, ok := sqlState(err); ok || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var netErr net.Error
	return errors.As(err, &netErr) ||
		errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, driver.ErrBadConn)
}
