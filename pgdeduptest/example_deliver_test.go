package pgdeduptest_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// printT is a pgdeduptest.TB that prints failures. In a test, pass t.
type printT struct{}

func (printT) Helper()                        {}
func (printT) Errorf(format string, a ...any) { fmt.Printf("FAIL: "+format+"\n", a...) }
func (printT) Fatalf(format string, a ...any) { fmt.Printf("FAIL: "+format+"\n", a...) }

// A handler's test delivers the same order three times in a row, eight times
// at once, and once cut before COMMIT then again. Each time the handler's
// effect, counted by the test's own query, must happen once.
func Example() {
	pool, done := pgdeduptest.ForExample() // in a test: db := pgdeduptest.New(t)
	defer done()
	t := printT{}
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (order_id text)`); err != nil {
		log.Fatal(err)
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	handle := func(orderID string) func(context.Context, pgx.Tx) error { // the consumer's fn
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO charges VALUES ($1)`, orderID)
			return err
		}
	}
	charges := func(orderID string) func(context.Context) (int, error) {
		return func(ctx context.Context) (n int, err error) {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM charges WHERE order_id = $1`, orderID).Scan(&n)
			return n, err
		}
	}
	fmt.Println(pgdeduptest.DeliverSequentially(t, store, "o-1", 3, handle("o-1")))
	pgdeduptest.AssertOnce(t, charges("o-1"))
	fmt.Println(pgdeduptest.DeliverConcurrently(t, store, "o-2", 8, handle("o-2")))
	pgdeduptest.AssertOnce(t, charges("o-2"))
	fmt.Println(pgdeduptest.DeliverCutBeforeCommit(t, store, "o-3", handle("o-3")))
	pgdeduptest.AssertOnce(t, charges("o-3"))
	// Output:
	// 1
	// 1
	// 1
}
