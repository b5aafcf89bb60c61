package pgdedup_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// Stats is what `pgdedup stats` prints and what a metrics exporter reads (the
// Prometheus collector in contrib/pgdedupprom does): rows per consumer, expired
// rows, sizes.
func ExampleStore_Stats() {
	pool, done := pgtest.ForExample()
	defer done()
	ctx := context.Background()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	noop := func(context.Context, pgx.Tx) error { return nil }
	for _, id := range []string{"order-1", "order-2", "order-1"} {
		if _, err := store.Process(ctx, id, noop); err != nil {
			log.Fatal(err)
		}
	}

	st, err := store.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range st.Consumers {
		fmt.Printf("%s: %d rows, %d expired\n", c.Consumer, c.Rows, c.ExpiredRows)
	}
	fmt.Println("has indexes:", st.IndexBytes > 0)
	// Output:
	// billing: 2 rows, 0 expired
	// has indexes: true
}
