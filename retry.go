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
)

// retry runs attempt until it succeeds, fails permanently, MaxAttempts is
// reached or ctx is done, sleeping a jittered, growing backoff in between.
// Only failures of the database are retried (see IsTransient): attempt marks
// the errors of its own statements and of fn with fromDatabase and fromFn.
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

// backoff returns the pause after failed attempt n (from 1): 10ms doubling up
// to 1s, with full jitter in its upper half so that colliding consumers spread.
func backoff(n int) time.Duration {
	d := min(10*time.Millisecond<<min(n-1, 7), time.Second)
	return d/2 + rand.N(d/2)
}

// IsTransient reports whether err is a failure of the database that trying
// again can cure. It answers true for:
//
//   - an error carrying one of these SQLSTATEs, from pgx's *pgconn.PgError or
//     from any database/sql driver whose error has a SQLState() string method
//     (lib/pq, pgx's stdlib): serialization failure 40001, deadlock 40P01,
//     admin or crash shutdown 57P01 and 57P02, cannot connect now 57P03, and
//     the connection exceptions of class 08;
//   - a connection to the database lost under a statement that pgdedup sent,
//     or under fn's transaction in [Store.Process] and the other Process calls
//     (pgdedup marks those errors itself);
//   - a connection that could not be opened (*pgconn.ConnectError), an error
//     pgx reports as safe to retry because nothing was sent, and
//     database/sql's driver.ErrBadConn.
//
// It answers false for everything else, in particular for io.EOF, a reset
// connection or any other network error that does not come from the
// database: an HTTP client's error or a decoder's io.EOF returned by fn is not
// transient, whatever its type, because pgdedup cannot know whether the other
// side acted on the request. Context cancellation is never transient. It
// classifies by SQLSTATE and type, never by message text.
//
// [Store.Process], [Store.ProcessBatch] and [Store.ProcessOffsets] retry what
// it calls transient themselves, up to [Config.MaxAttempts]. A consumer can
// use it to decide between requeueing a message (true) and dead-lettering it.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
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
func sqlState(err error) (string, bool) {
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

// connLostError marks an error as the loss of the connection to the
// database, which IsTransient cannot tell from other network errors by type
// alone. Its message is the error's own.
type connLostError struct{ err error }

func (e *connLostError) Error() string { return e.err.Error() }
func (e *connLostError) Unwrap() error { return e.err }

// fromDatabase marks err, returned by a statement pgdedup sent itself (BEGIN,
// a claim, COMMIT), as a lost connection when it is a network failure rather
// than an answer of the server: such an error can only have come from the
// database connection.
func fromDatabase(err error) error {
	if err == nil || !isNetworkFailure(err) {
		return err
	}
	return &connLostError{err}
}

// fromFn marks err, returned by fn, as a lost connection when tx's connection
// is closed, which pgx does when the connection fails. Otherwise err is
// returned unchanged: whatever its type, it did not come from tx's connection
// (an HTTP call's EOF, a decoder's), so it is not retried. Errors the server
// sent (a *pgconn.PgError, such as a serialization failure) are left as they
// are: IsTransient reads their SQLSTATE.
func fromFn(tx pgx.Tx, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if c := tx.Conn(); c != nil && c.IsClosed() {
		return &connLostError{err}
	}
	return err
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
