package pgdedup_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// A database/sql consumer (sqlc, sqlx, bun...) claims the message ID in its
// own *sql.Tx. One pgx pool serves both pgdedup and database/sql.
func ExampleStore_ClaimSQL() {
	pool, done := pgtest.ForExample() // your *pgxpool.Pool
	defer done()
	db := stdlib.OpenDBFromPool(pool) // the *sql.DB your queries use
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE charges (order_id text NOT NULL)`); err != nil {
		panic(err)
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		panic(err)
	}

	handle := func(ctx context.Context, messageID, orderID string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // no-op after Commit
		claimed, err := store.ClaimSQL(ctx, tx, messageID)
		if err != nil || !claimed {
			return err // a duplicate is not an error: ack it
		}
		// With sqlc: queries.WithTx(tx).InsertCharge(ctx, orderID)
		if _, err := tx.ExecContext(ctx, `INSERT INTO charges (order_id) VALUES ($1)`, orderID); err != nil {
			return err
		}
		return tx.Commit()
	}

	for range 3 { // the broker delivers the message three times
		if err := handle(ctx, "msg-1", "order-1"); err != nil {
			panic(err)
		}
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM charges`).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("charges:", n)
	// Output: charges: 1
}
