package pgdedup

import (
	"github.com/pgdedup/pgdedup/internal/engine"
)

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
func IsTransient(err error) bool { return engine.IsTransient(err) }
