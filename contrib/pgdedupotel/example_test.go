package pgdedupotel_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/contrib/pgdedupotel"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// OnEvent goes into the Store's Config, and Trace wraps the Store. A service
// passes its own providers (or none, for the global ones). This example reads
// the metrics back with a ManualReader.
func Example() {
	pool, done := pgdeduptest.ForExample()
	defer done()
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	cfg := pgdedupotel.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}

	onEvent, err := pgdedupotel.OnEvent(cfg)
	if err != nil {
		log.Fatal(err)
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", OnEvent: onEvent})
	if err != nil {
		log.Fatal(err)
	}
	traced := pgdedupotel.Trace(store, cfg)
	for _, id := range []string{"order-1", "order-2", "order-1", "order-1"} {
		if _, err := traced.Process(ctx, id, func(context.Context, pgx.Tx) error { return nil }); err != nil {
			log.Fatal(err)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "pgdedup.messages" {
			for _, p := range sum.DataPoints {
				outcome, _ := p.Attributes.Value(pgdedupotel.AttrOutcome)
				fmt.Println(outcome.AsString(), p.Value)
			}
		}
	}
	// Unordered output:
	// processed 2
	// duplicate 2
}
