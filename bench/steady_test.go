package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
)

// -steady-tiny is the CI size unless a flag says otherwise; the proportion
// follows from the flags; bad flags are refused before a cluster starts.
func TestSteadyFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"-only", "steady"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.steady
	if c.layout != "plain" || c.rate != 800 || c.cycle != 30*time.Second || c.retention() != 96*time.Minute ||
		c.rows() != 4_608_000 || c.cycles != 6 || c.dupShare != 0.1 || c.cleanEach != 5*time.Second || !c.serverCheckpoints() {
		t.Errorf("defaults: %+v; want issue 18's proportion: 800 msg/s, 30 s cycles, Retention 192 cycles (4,608,000 rows)", c)
	}
	if c.ports[0] != 5440 || c.ports[len(c.ports)-1] != 5449 {
		t.Errorf("ports %v, want 5440-5449", c.ports)
	}
	if c.naptime() != 2*time.Second {
		t.Errorf("naptime %s, want 2s (1 min per 15 min cycle, at 30 s cycles)", c.naptime())
	}

	cfg, err = parseFlags([]string{"-only", "steady", "-steady-tiny", "-steady-rate", "50", "-o", "results/a b.md"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c = cfg.steady
	if c.rate != 50 || c.ratio != 8 || c.cycle != 5*time.Second || c.cycles != 2 || c.serverCheckpoints() {
		t.Errorf("tiny with -steady-rate 50: %+v; want rate 50, R 8, 5 s cycles made by the bench, 2 cycles", c)
	}
	if want := `go run -C bench . -only steady -steady-tiny -steady-rate 50 -o 'results/a b.md'`; c.command != want {
		t.Errorf("command %q, want %q", c.command, want)
	}

	// The default window is whole partition spans: span ÷ cycle = 192 ÷ partitions.
	for _, tc := range []struct {
		args   []string
		cycles int
	}{
		{[]string{"-layout", "plain"}, 6},
		{[]string{"-layout", "partitioned"}, 16}, // the default 12: one span
		{[]string{"-layout", "partitioned", "-partitions", "6"}, 32},
		{[]string{"-layout", "partitioned", "-partitions", "24"}, 8},
		{[]string{"-layout", "partitioned", "-partitions", "48"}, 8},   // two spans of 4
		{[]string{"-layout", "partitioned", "-partitions", "10"}, 20},  // a span of 19.2 cycles, rounded up
		{[]string{"-layout", "partitioned", "-partitions", "100"}, 8},  // four spans of 1.92
		{[]string{"-layout", "partitioned", "-steady-cycles", "3"}, 3}, // set by hand
	} {
		cfg, err := parseFlags(append([]string{"-only", "steady"}, tc.args...), io.Discard)
		if err != nil || cfg.steady.cycles != tc.cycles {
			t.Errorf("%v: %d cycles (%v), want %d", tc.args, cfg.steady.cycles, err, tc.cycles)
		}
	}

	cfg, err = parseFlags([]string{"-only", "steady", "-steady-workers", "16", "-steady-pool-conns", "4"}, io.Discard)
	if err != nil || cfg.steady.workers != 16 || cfg.steady.poolConns != 4 {
		t.Errorf("-steady-workers 16 -steady-pool-conns 4: %+v, %v", cfg.steady, err)
	}

	for _, args := range [][]string{
		{"-layout", "heap"},
		{"-steady-rate", "0"},
		{"-steady-ratio", "1"},
		{"-steady-cycles", "-1"},
		{"-steady-cycle", "10ms"},
		{"-steady-dups", "1.5"},
		{"-steady-clean-every", "0s"},
		{"-steady-workers", "0"},
		{"-steady-pool-conns", "1"},
		{"-steady-pool-conns", "-2"},
		{"-steady-tput-for", "10ms"},
		{"-steady-rate", "100000", "-steady-ratio", "10000"},
	} {
		if _, err := parseFlags(append([]string{"-only", "steady"}, args...), io.Discard); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	if _, err := parseFlags([]string{"-only", "steady,soak"}, io.Discard); err == nil {
		t.Error("-only steady,soak: no error; steady runs alone")
	}
}

// The preload is what claims would have left: keys that pgdedup.Key finds
// (so a preloaded ID redelivered is a duplicate), expiries spread evenly
// over the Retention, and a table whose primary key is the key again.
func TestSteadyPreload(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := newBench(ctx, testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	const rows = 1200
	retention := time.Hour
	t0 := time.Now()
	if err := preloadPlain(ctx, b.admin, rows, t0, retention); err != nil {
		t.Fatal(err)
	}
	var n int
	var first, last time.Time
	var pk string
	err = b.admin.QueryRow(ctx, `SELECT count(*), min(expires_at), max(expires_at),
(SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'processed_messages'::regclass AND contype = 'p')
FROM processed_messages WHERE message_id LIKE 'pre-%'`).Scan(&n, &first, &last, &pk)
	if err != nil {
		t.Fatal(err)
	}
	step := retention / rows
	if n != rows || first.Sub(t0).Round(time.Millisecond) != step || last.Sub(t0).Round(time.Millisecond) != retention || pk != "PRIMARY KEY (key)" {
		t.Errorf("%d rows expiring from t0+%s to t0+%s, %s; want %d from t0+%s to t0+%s, PRIMARY KEY (key)",
			n, first.Sub(t0), last.Sub(t0), pk, rows, step, retention)
	}
	store, err := pgdedup.New(b.admin, pgdedup.Config{Consumer: consumer, Retention: retention})
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		id, sent, ok := preloadedID(rows, t0, retention)
		if !ok || !strings.HasPrefix(id, "pre-") {
			t.Fatalf("preloadedID: %q, %v", id, ok)
		}
		var claimed time.Time
		if err := b.admin.QueryRow(ctx, `SELECT processed_at FROM processed_messages WHERE message_id = $1`, id).Scan(&claimed); err != nil {
			t.Fatal(err)
		}
		if d := sent.Sub(claimed); d < -time.Millisecond || d > time.Millisecond {
			t.Errorf("preloadedID(%s): sent at %s; the preload claimed it at %s", id, sent, claimed)
		}
		processed, err := store.Process(ctx, id, func(context.Context, pgx.Tx) error {
			return fmt.Errorf("business write ran for the preloaded ID %s", id)
		}, pgdedup.WithSentAt(sent))
		if err != nil || processed {
			t.Errorf("Process(%s): processed %v, %v; want a duplicate", id, processed, err)
		}
	}
	// Only IDs that stay duplicates for a while are redelivered.
	if id, _, ok := preloadedID(rows, t0.Add(-time.Hour), retention); ok {
		t.Errorf("preloadedID after the Retention: %q; want none", id)
	}
}

// On the partitioned layout the preload goes through the parent into the
// partitions of the past Retention, which claims look up: a preloaded ID
// redelivered is a duplicate, and no partition is left without its rows.
func TestSteadyPreloadPartitioned(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := newBench(ctx, testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	if _, err := b.admin.Exec(ctx, `TRUNCATE processed_messages`); err != nil { // Setup takes an empty table
		t.Fatal(err)
	}
	const rows = 1200
	retention := time.Hour
	cfg := pgdedup.Config{Consumer: consumer, Retention: retention, Layout: pgdedup.LayoutPartitioned, Partitions: 6}
	store, err := pgdedup.New(b.admin, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := preloadPartitioned(ctx, b.admin, rows, t0, retention); err != nil {
		t.Fatal(err)
	}
	var n, parts, filled int
	err = b.admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM processed_messages WHERE message_id LIKE 'pre-%'),
count(*), count(*) FILTER (WHERE EXISTS (SELECT FROM processed_messages m WHERE m.tableoid = i.inhrelid))
FROM pg_inherits i WHERE i.inhparent = 'processed_messages'::regclass`).Scan(&n, &parts, &filled)
	if err != nil {
		t.Fatal(err)
	}
	if n != rows || filled < 6 {
		t.Errorf("%d rows in %d of %d partitions; want %d rows in the 6 (or 7) partitions of the past Retention", n, filled, parts, rows)
	}
	// -steady-sent-at's redeliveries pass the preloaded ID's time: a claim
	// bounded by it, with a margin of a millisecond, finds the row too.
	cfg.SentAtMargin = time.Millisecond
	bounded, err := pgdedup.New(b.admin, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		id, sent, _ := preloadedID(rows, t0, retention)
		s, opts := store, []pgdedup.Option(nil)
		if i%2 == 1 {
			s, opts = bounded, append(opts, pgdedup.WithSentAt(sent))
		}
		processed, err := s.Process(ctx, id, func(context.Context, pgx.Tx) error {
			return fmt.Errorf("business write ran for the preloaded ID %s", id)
		}, opts...)
		if err != nil || processed {
			t.Errorf("Process(%s, %d options): processed %v, %v; want a duplicate", id, len(opts), processed, err)
		}
	}
}

// The results file scales the measured WAL per message and size per row to
// a day at 1,000 msg/s and a 48 h table, so that the docs need not.
func TestSteadyScaled(t *testing.T) {
	r := steadyResult{
		empty: steadyRun{walBytes: 600_000, messages: 1000},
		full:  steadyRun{walBytes: 4_800_000, messages: 1000, heap: 90_000_000, indexes: 60_000_000, rowsEnd: 1_000_000},
	}
	got := r.scaled()
	for _, want := range []string{"WAL a day at 1,000 new messages/s: 414.7 GB at steady state, 51.8 GB on the empty table",
		"holding 48h0m0s of it (172,800,000 rows): 25.9 GB"} {
		if !strings.Contains(got, want) {
			t.Errorf("scaled: %q lacks %q", got, want)
		}
	}
}

// The report places the window in its partition's span as date_bin does:
// spans of the partitioned layout start at its origin, 2000-01-01 UTC.
func TestSpanOffset(t *testing.T) {
	origin := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	span := 8 * time.Minute
	for _, c := range []struct {
		at   time.Time
		want time.Duration
	}{
		{origin, 0},
		{origin.Add(1000*span + 90*time.Second), 90 * time.Second},
		{time.Date(2026, 12, 5, 18, 9, 44, 0, time.FixedZone("CET", 3600)).Add(time.Hour), 104 * time.Second}, // PostgreSQL: the time less date_bin('8 min', the time, origin),
	} {
		if got := spanOffset(c.at, span); got != c.want {
			t.Errorf("spanOffset(%s, %s) = %s, want %s", c.at, span, got, c.want)
		}
	}
}
