package pgdedup_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// A Kafka consumer charges each order once: the partition's offset commits
// with the charges, and a batch fetched again after a rebalance or a crash is
// skipped up to the stored offset.
func ExampleStore_ProcessOffsets() {
	ctx := context.Background()
	pool, done := pgtest.ForExample() // a *pgxpool.Pool on a migrated schema
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (record text, amount int)`); err != nil {
		log.Fatal(err)
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}

	// On assignment: resume from the database's offsets, not Kafka's.
	next, err := store.ResumeOffsets(ctx, map[string][]int32{"orders": {0}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("resume from:", next) // nothing stored yet: the group's reset policy decides

	p := pgdedup.TopicPartition{Topic: "orders", Partition: 0}
	for _, fetched := range [][]int64{{0, 1, 2}, {1, 2, 3, 4}} { // the second fetch overlaps the first
		fresh, err := store.ProcessOffsets(ctx, p, fetched, func(ctx context.Context, tx pgx.Tx, fresh []int64) error {
			for _, offset := range fresh {
				if _, err := tx.Exec(ctx, `INSERT INTO charges VALUES ($1, 100)`, fmt.Sprint("orders/0/", offset)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			log.Fatal(err) // nothing committed: seek back to ResumeOffsets and fetch again
		}
		fmt.Println("fetched", fetched, "charged", fresh)
	}

	next, err = store.ResumeOffsets(ctx, map[string][]int32{"orders": {0}})
	if err != nil {
		log.Fatal(err)
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&n)
	fmt.Println("resume from:", next, "charges:", n)
	// Output:
	// resume from: map[]
	// fetched [0 1 2] charged [0 1 2]
	// fetched [1 2 3 4] charged [3 4]
	// resume from: map[orders:map[0:5]] charges: 5
}
