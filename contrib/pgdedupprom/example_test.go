package pgdedupprom_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/contrib/pgdedupprom"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// A service registers the collector next to its own metrics and serves them
// with promhttp.Handler(). Here the registry is read back directly.
func ExampleNewCollector() {
	pool, done := pgdeduptest.ForExample()
	defer done()
	ctx := context.Background()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	// The table is read at the first scrape, then at most once a minute.
	reg.MustRegister(pgdedupprom.NewCollector(store, pgdedupprom.Options{}))

	for _, id := range []string{"order-1", "order-2", "order-1"} {
		if _, err := store.Process(ctx, id, func(context.Context, pgx.Tx) error { return nil }); err != nil {
			log.Fatal(err)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "pgdedup_rows" || mf.GetName() == "pgdedup_expired_rows" {
			for _, m := range mf.GetMetric() {
				fmt.Println(mf.GetName(), m.GetLabel()[0].GetValue(), m.GetGauge().GetValue())
			}
		}
	}
	// Output:
	// pgdedup_expired_rows billing 0
	// pgdedup_rows billing 2
}
