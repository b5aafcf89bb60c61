package pgdedup_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// A consumer charges each order once, however often the broker delivers it.
func ExampleStore_Process() {
	ctx := context.Background()
	pool, done := pgtest.ForExample() // a *pgxpool.Pool on a migrated schema
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (order_id text, amount int)`); err != nil {
		log.Fatal(err)
	}

	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	for _, msgID := range []string{"msg-1", "msg-1", "msg-2"} { // msg-1 is redelivered
		processed, err := store.Process(ctx, msgID, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO charges VALUES ($1, 100)`, "order-"+msgID)
			return err
		})
		if err != nil {
			log.Fatal(err) // nack: the broker redelivers, nothing was recorded
		}
		fmt.Println(msgID, "processed:", processed) // ack either way
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&n)
	fmt.Println("charges:", n)
	// Output:
	// msg-1 processed: true
	// msg-1 processed: false
	// msg-2 processed: true
	// charges: 2
}

// Claim records the ID inside a transaction you already run.
func ExampleStore_Claim() {
	ctx := context.Background()
	pool, done := pgtest.ForExample()
	defer done()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "emails"})
	if err != nil {
		log.Fatal(err)
	}
	for range 2 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			claimed, err := store.Claim(ctx, tx, "welcome-user-7")
			if err != nil || !claimed {
				fmt.Println("claimed:", claimed)
				return err // a duplicate: nothing to do, the transaction is still usable
			}
			fmt.Println("claimed:", claimed)
			_, err = tx.Exec(ctx, `SELECT 'queue the welcome email in the outbox here'`)
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// claimed: true
	// claimed: false
}

// ClaimBatch records many IDs in one statement and returns the new ones.
func ExampleStore_ClaimBatch() {
	ctx := context.Background()
	pool, done := pgtest.ForExample()
	defer done()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "ingest"})
	if err != nil {
		log.Fatal(err)
	}
	for _, batch := range [][]string{{"e1", "e2", "e2"}, {"e2", "e3", "e1"}} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			fresh, err := store.ClaimBatch(ctx, tx, batch)
			fmt.Println("fresh:", fresh)
			return err // insert the fresh events here, in tx
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// fresh: [e1 e2]
	// fresh: [e3]
}

// MessageIDFromContent derives an ID from the payload for sources that send none.
func ExampleMessageIDFromContent() {
	fmt.Println(pgdedup.MessageIDFromContent([]byte(`{"order_id":42}`))[:16])
	// Output: 2ba2950dab99043d
}

// Key finds an ID's row by its primary key, in Go or in SQL (pgdedup_key).
func ExampleKey() {
	ctx := context.Background()
	pool, done := pgtest.ForExample()
	defer done()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := store.Process(ctx, "order-1", func(context.Context, pgx.Tx) error { return nil }); err != nil {
		log.Fatal(err)
	}
	var id string
	err = pool.QueryRow(ctx, `SELECT message_id FROM processed_messages
WHERE key = $1 AND key = pgdedup_key('billing', 'order-1')`, pgdedup.Key("billing", "order-1")).Scan(&id)
	fmt.Println(pgdedup.Key("billing", "order-1"), id, err)
	// Output:
	// 6a4c5c6d-d5c8-489d-1422-999764c15c8a order-1 <nil>
}
