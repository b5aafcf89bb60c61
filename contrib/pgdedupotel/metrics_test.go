package pgdedupotel_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/contrib/pgdedupotel"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// The metrics equal what happened. Each delivery is counted by outcome and
// checked against the charges written and the IDs recorded in the database.
func TestOnEventCountsWhatHappened(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	onEvent, err := pgdedupotel.OnEvent(pgdedupotel.Config{
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		Attributes:    []attribute.KeyValue{attribute.String("messaging.system", "rabbitmq")},
	})
	if err != nil {
		t.Fatal(err)
	}
	pool, store := setup(t, pgdedup.Config{Consumer: "billing", LockTimeout: 100 * time.Millisecond, OnEvent: onEvent})
	ctx := ctxT(t)
	process := func(id string) {
		if _, err := store.Process(ctx, id, charge(id)); err != nil {
			t.Fatal(err)
		}
	}
	batch := func(ids ...string) {
		if _, err := store.ProcessBatch(ctx, ids, chargeBatch); err != nil {
			t.Fatal(err)
		}
	}

	process("a")                                                              // processed
	process("a")                                                              // duplicate
	batch("a", "b", "c", "b")                                                 // b and c processed, and a is a duplicate
	batch("c")                                                                // duplicate, fn not called
	if _, err := store.Process(ctx, "r", failOnce(charge("r"))); err != nil { // a retry, then processed
		t.Fatal(err)
	}
	// fn failing for good is no event, because nothing happened to the message.
	if _, err := store.Process(ctx, "bad", func(context.Context, pgx.Tx) error { return errors.New("card declined") }); err == nil {
		t.Fatal("want fn's error")
	}
	held := pgdeduptest.HoldClaim(t, pool, store, "h")
	if _, err := store.Process(ctx, "h", charge("h")); !errors.Is(err, pgdedup.ErrInFlight) { // in_flight 1
		t.Fatalf("in flight: %v", err)
	}
	if _, err := store.ProcessBatch(ctx, []string{"h", "z"}, chargeBatch); !errors.Is(err, pgdedup.ErrInFlight) { // in_flight 2
		t.Fatalf("batch in flight: %v", err)
	}
	if err := held.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	pgdeduptest.Exec(t, pool, `INSERT INTO processed_messages (consumer, message_id, expires_at)
SELECT 'emails', 'old-' || g, now() - interval '1 minute' FROM generate_series(1, 5) g`)
	deleted, err := store.Cleanup(ctx)
	if err != nil || deleted != 5 {
		t.Fatalf("cleanup: %d, %v", deleted, err)
	}

	got := collect(t, reader)
	charges := pgdeduptest.Count(t, pool, `SELECT count(*) FROM charges`)
	ids := pgdeduptest.Count(t, pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'billing'`)
	if charges != 4 || ids != 4 {
		t.Fatalf("database: %d charges, %d IDs recorded; want a, b, c, r", charges, ids)
	}
	const c, sys = "messaging.consumer.group.name=billing", "messaging.system=rabbitmq"
	want := map[string]float64{
		"pgdedup.messages{" + c + "," + sys + ",pgdedup.outcome=processed}":                        float64(charges),
		"pgdedup.messages{" + c + "," + sys + ",pgdedup.outcome=duplicate}":                        3,
		"pgdedup.messages{" + c + "," + sys + ",pgdedup.outcome=in_flight}":                        3,
		"messaging.process.duration{" + c + ",messaging.operation.name=process," + sys + "}":       2, // a, r as counts of the histogram
		"messaging.process.duration{" + c + ",messaging.operation.name=process_batch," + sys + "}": 1,
		"pgdedup.retries{error.type=40001," + c + "," + sys + "}":                                  1,
		"pgdedup.cleanup.deleted{" + c + "," + sys + "}":                                           float64(deleted),
		"pgdedup.cleanup.duration{" + c + "," + sys + "}":                                          1,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected series %s = %v", k, got[k])
		}
	}
	if t.Failed() {
		t.Logf("collected: %v", got)
	}
}

// A failed cleanup is measured with its error.type.
func TestOnEventCleanupFailure(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	onEvent, err := pgdedupotel.OnEvent(pgdedupotel.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	pool, _ := setup(t, pgdedup.Config{Consumer: "billing"})
	missing, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", Table: "no_such_table", OnEvent: onEvent})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := missing.Cleanup(ctxT(t)); err == nil {
		t.Fatal("cleanup of a missing table succeeded")
	}
	got := collect(t, reader)
	if k := "pgdedup.cleanup.duration{error.type=42P01,messaging.consumer.group.name=billing}"; got[k] != 1 {
		t.Errorf("%s = %v, want 1; collected %v", k, got[k], got)
	}
}

// A cleanup starved of the cleaners' turn (another session holds it) is
// measured with error.type cleanup_starved, which the shipped alert rule
// (contrib/pgdedupprom/alerts.yml) selects.
func TestOnEventCleanupStarved(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	onEvent, err := pgdedupotel.OnEvent(pgdedupotel.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	pool, _ := setup(t, pgdedup.Config{Consumer: "billing"})
	ctx := ctxT(t)
	pgdeduptest.Exec(t, pool, `INSERT INTO processed_messages (consumer, message_id, processed_at, expires_at)
VALUES ('billing', 'old', now() - interval '2 hours', now() - interval '1 hour')`)
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_xact_lock(1885824100, 'processed_messages'::regclass::oid::int4)`); err != nil {
		t.Fatal(err)
	}
	cron, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", CleanupTurnWait: 200 * time.Millisecond, OnEvent: onEvent})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cron.Cleanup(ctx); !errors.Is(err, pgdedup.ErrCleanupStarved) {
		t.Fatalf("Cleanup with the turn held: %v, want ErrCleanupStarved", err)
	}
	got := collect(t, reader)
	if k := "pgdedup.cleanup.duration{error.type=cleanup_starved,messaging.consumer.group.name=billing}"; got[k] != 1 {
		t.Errorf("%s = %v, want 1; collected %v", k, got[k], got)
	}
}

// collect reads reader once and flattens it. Counters become their sum and
// histograms their count, keyed by name{attributes sorted by key}.
func collect(t *testing.T, reader sdkmetric.Reader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	key := func(name string, set attribute.Set) string {
		var kv []string
		for _, a := range set.ToSlice() {
			kv = append(kv, string(a.Key)+"="+a.Value.String())
		}
		slices.Sort(kv)
		return fmt.Sprintf("%s{%s}", name, strings.Join(kv, ","))
	}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != pgdedupotel.ScopeName {
			t.Errorf("scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)] += float64(p.Value)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)] += float64(p.Count)
					if p.Sum <= 0 {
						t.Errorf("%s: durations sum to %v", m.Name, p.Sum)
					}
				}
			default:
				t.Errorf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}
