// Package pgdedupotel tests contrib/pgdedupotel where it needs the
// repository's wire proxy, which stays out of the contrib module.
package pgdedupotel_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/contrib/pgdedupotel"
	"github.com/pgdedup/pgdedup/internal/pgtest"
	"github.com/pgdedup/pgdedup/internal/wireproxy"
)

// A connection cut at COMMIT is a retry with error.type connection. If the
// COMMIT had not reached the server, the retry processes the message; if it
// had (the ambiguous commit), the retry finds the ID and the message counts
// as a duplicate, although this very call charged it: the metrics count
// attempts as Postgres saw them, and the charge is there once either way.
func TestOnEventCountsCutCommits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		how     wireproxy.Cut
		outcome string
	}{{wireproxy.CutBeforeCommit, "processed"}, {wireproxy.CutAfterCommit, "duplicate"}} {
		t.Run(tc.outcome, func(t *testing.T) {
			t.Parallel()
			reader := sdkmetric.NewManualReader()
			onEvent, err := pgdedupotel.OnEvent(pgdedupotel.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
			if err != nil {
				t.Fatal(err)
			}
			db := pgtest.New(t)
			pgtest.Exec(t, db.Pool, `CREATE TABLE charges (id bigserial PRIMARY KEY, order_id text NOT NULL)`)
			proxy, proxied := pgtest.NewProxy(t, db.URL, wireproxy.Config{})
			store, err := pgdedup.New(pgtest.Pool(t, proxied, 2), pgdedup.Config{Consumer: "billing", OnEvent: onEvent})
			if err != nil {
				t.Fatal(err)
			}
			proxy.CutCommits(1, tc.how)
			if _, err := store.Process(ctxT(t), "a", charge("a")); err != nil {
				t.Fatal(err)
			}
			if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM charges`); n != 1 {
				t.Fatalf("%d charges, want 1", n)
			}
			got := collect(t, reader)
			const c = "messaging.consumer.group.name=billing"
			if got["pgdedup.retries{error.type=connection,"+c+"}"] != 1 || got["pgdedup.messages{"+c+",pgdedup.outcome="+tc.outcome+"}"] != 1 {
				t.Errorf("collected %v: want one retry (connection) and one message %s", got, tc.outcome)
			}
		})
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// charge is the business write: one charges row per order.
func charge(id string) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO charges (order_id) VALUES ($1)`, id)
		return err
	}
}

// collect reads reader once and flattens its counters, keyed by
// name{attributes sorted by key}, to their sums.
func collect(t *testing.T, reader sdkmetric.Reader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, p := range d.DataPoints {
					var kv []string
					for _, a := range p.Attributes.ToSlice() {
						kv = append(kv, string(a.Key)+"="+a.Value.String())
					}
					slices.Sort(kv)
					out[fmt.Sprintf("%s{%s}", m.Name, strings.Join(kv, ","))] += float64(p.Value)
				}
			}
		}
	}
	return out
}
