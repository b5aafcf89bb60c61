package idempotency

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// ErrTxManaged is what Commit and Rollback of the transaction from [Tx]
// return. The middleware ends that transaction after the handler returns, and
// commits the handler's writes with the stored response. A handler that
// calls either fails its request with 500, and the misuse is logged by name.
var ErrTxManaged = errors.New("idempotency: the handler must not commit or roll back idempotency.Tx: " +
	"the middleware does, after the handler returns (use tx.Begin for a savepoint)")

// handlerTx is the transaction handed to the handler. It is the claim's
// transaction, whose Commit and Rollback are refused and remembered.
type handlerTx struct {
	pgx.Tx
	ended atomic.Bool
}

// Commit refuses, see ErrTxManaged.
func (t *handlerTx) Commit(context.Context) error {
	t.ended.Store(true)
	return ErrTxManaged
}

// Rollback refuses, see ErrTxManaged.
func (t *handlerTx) Rollback(context.Context) error {
	t.ended.Store(true)
	return ErrTxManaged
}

// txState is what the server last said about tx's transaction, read from the
// connection without a round trip. It is 'T' in a transaction and 'E' in a
// failed one, where a statement failed and was not rolled back to a
// savepoint. It is 'I' outside any, when the handler sent COMMIT or ROLLBACK
// as SQL.
func txState(tx pgx.Tx) byte {
	if c := tx.Conn(); c != nil && c.PgConn() != nil {
		return c.PgConn().TxStatus()
	}
	return 'T'
}
