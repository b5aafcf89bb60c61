package pgdedup_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// The Partitioned layout: Setup, once after Migrate, replaces the empty table
// by one partitioned by claim time; claims work as on the plain table; Cleanup
// creates, seals and drops partitions instead of deleting rows.
func ExampleStore_Setup() {
	pool, done := pgtest.ForExample()
	defer done()
	ctx := context.Background()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing",
		Layout: pgdedup.LayoutPartitioned, Partitions: 12}) // 48 h ÷ 12 = 4 h partitions
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Setup(ctx); err != nil {
		log.Fatal(err)
	}
	noop := func(context.Context, pgx.Tx) error { return nil }
	for _, id := range []string{"order-1", "order-1"} {
		processed, err := store.Process(ctx, id, noop)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(id, "processed:", processed)
	}
	if _, err := store.Cleanup(ctx); err != nil { // RunCleaner calls it every interval
		log.Fatal(err)
	}

	st, err := store.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	open, rows := 0, int64(0)
	for _, p := range st.Partitions {
		if !p.Sealed {
			open++ // the current one, or one of the 48-hour runway ahead
		}
		rows += p.Rows
	}
	fmt.Println("span:", st.PartitionSpan)
	fmt.Println("unsealed partitions:", open)
	fmt.Println("rows:", rows)
	// Output:
	// order-1 processed: true
	// order-1 processed: false
	// span: 4h0m0s
	// unsealed partitions: 13
	// rows: 1
}
