package engine

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// IsTransient is pgdedup.IsTransient, whose comment says what it answers.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var fnErr *fnError
	if errors.As(err, &fnErr) {
		return fnErr.transient
	}
	var lost *shape.ConnLostError
	if errors.As(err, &lost) {
		return true
	}
	if code, ok := shape.SQLState(err); ok {
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

// FromDatabase marks err as a lost connection when it is a network failure
// rather than an answer of the server. err must come from a statement
// pgdedup sent itself, such as BEGIN, a claim or COMMIT. Such an error can
// only have come from the database connection.
func FromDatabase(err error) error {
	if err == nil || !isNetworkFailure(err) {
		return err
	}
	return &shape.ConnLostError{Err: err}
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

// transienter marks an error as transient where a placement knows more than
// IsTransient.
type transienter interface{ Transient(err error) error }

// fromFn returns err, returned by fn, with the verdict of whether tx failed.
// tx is pgdedup's own transaction.
//
// tx failed when its connection is closed, which pgx does when the
// connection fails. tx also failed when the server aborted it (transaction
// status 'E') and err carries the failure the server reported to a pgx
// statement of tx. That is a *pgconn.PgError with a SQLSTATE that
// IsTransient retries, such as 40001, 40P01, or 08006 for a Citus worker
// lost under the statement. It may also be an error that p, the placement,
// knows a new transaction cures.
//
// Any other error did not come from tx, whatever its type or SQLSTATE. It
// may be another connection's error, an HTTP call's or a decoder's. It is
// returned after one attempt and not called transient. Cancellation is left
// as it is.
func fromFn(tx pgx.Tx, p transienter, err error) error {
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
	err = p.Transient(err) // a partitioned table's advice, or Citus's XX000
	if _, lost := err.(*shape.ConnLostError); lost {
		return &fnError{err: err, transient: true}
	}
	var pgErr *pgconn.PgError
	aborted := errors.As(err, &pgErr) && transientSQLState(pgErr.Code)
	return &fnError{err: err, transient: aborted}
}

// isNetworkFailure reports whether err is a failure of the transport. An
// answer of the server and a cancellation are not.
func isNetworkFailure(err error) bool {
	if _, ok := shape.SQLState(err); ok || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
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

// RetryableSQLState reports whether err carries a SQLSTATE that a later
// attempt can cure, beyond those IsTransient retries at once. ActionFor
// requeues for it. These are conditions of the server's load or its
// settings, which a retry within one call would only prolong.
func RetryableSQLState(err error) bool {
	code, ok := shape.SQLState(err)
	if !ok {
		return false
	}
	switch code {
	case "55P03", // lock_not_available, from lock_timeout or NOWAIT
		"57014", // query_canceled, from statement_timeout
		"25P03", // idle_in_transaction_session_timeout
		"57P05": // idle_session_timeout
		return true
	}
	// insufficient_resources, such as too many connections or a full disk
	return strings.HasPrefix(code, "53")
}
