package pgdedup

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// detailError adds the server's DETAIL and HINT to the message of a
// *pgconn.PgError, whose Error method leaves them out although they often say
// what went wrong (Citus, for one, explains in DETAIL why it refuses a
// statement). errors.As still finds the *pgconn.PgError.
type detailError struct {
	err  error
	text string
}

func (e *detailError) Error() string { return e.err.Error() + e.text }
func (e *detailError) Unwrap() error { return e.err }

// withDetail returns err with the DETAIL and HINT of the *pgconn.PgError it
// wraps, if any, added to its message; other errors are returned as they are.
func withDetail(err error) error {
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
