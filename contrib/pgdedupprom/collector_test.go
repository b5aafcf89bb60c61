package pgdedupprom_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/contrib/pgdedupprom"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

var perConsumer = []string{"pgdedup_stats_up", "pgdedup_rows", "pgdedup_expired_rows",
	"pgdedup_oldest_processed_timestamp_seconds", "pgdedup_next_expiry_timestamp_seconds"}

// The exported numbers are the table's, first with rows written by Process and
// by hand, then with what a Cleanup left.
func TestCollectorExportsTheTable(t *testing.T) {
	t.Parallel()
	db := pgdeduptest.New(t)
	ctx := context.Background()
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing", Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c := pgdedupprom.NewCollector(store, pgdedupprom.Options{MaxAge: -1}) // every scrape reads
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP pgdedup_stats_up 1 if the last read of the dedup table's stats succeeded, else 0.
# TYPE pgdedup_stats_up gauge
pgdedup_stats_up{table="processed_messages"} 1
`), perConsumer...); err != nil {
		t.Errorf("empty table: %v", err)
	}

	// billing has 3 rows of which 1 expired, and emails 2 rows, both expired.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, processed_at, expires_at) VALUES
	('billing', 'a', '2026-01-01T00:00:00Z', '2000-01-01T00:00:00Z'),
	('billing', 'b', '2026-01-02T00:00:00Z', '2999-01-01T00:00:00Z'),
	('emails', 'a', '2026-01-01T00:00:10.5Z', '2001-01-01T00:00:00Z'),
	('emails', 'b', '2026-01-01T00:00:20Z', '2001-01-01T00:00:00Z')`); err != nil {
		t.Fatal(err)
	}
	var claimedAt time.Time
	if _, err := store.Process(ctx, "c", func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT now()`).Scan(&claimedAt)
	}); err != nil {
		t.Fatal(err)
	}
	// The claim expires Retention after its transaction's now().
	next := float64(claimedAt.Add(time.Hour).UnixNano()) / 1e9
	want := fmt.Sprintf(`
# HELP pgdedup_expired_rows Rows past their expires_at, per consumer: the next cleanup deletes them.
# TYPE pgdedup_expired_rows gauge
pgdedup_expired_rows{consumer="billing",table="processed_messages"} 1
pgdedup_expired_rows{consumer="emails",table="processed_messages"} 2
# HELP pgdedup_next_expiry_timestamp_seconds Earliest expires_at still ahead among the consumer's rows, Unix time.
# TYPE pgdedup_next_expiry_timestamp_seconds gauge
pgdedup_next_expiry_timestamp_seconds{consumer="billing",table="processed_messages"} %s
# HELP pgdedup_oldest_processed_timestamp_seconds processed_at of the consumer's oldest row, Unix time.
# TYPE pgdedup_oldest_processed_timestamp_seconds gauge
pgdedup_oldest_processed_timestamp_seconds{consumer="billing",table="processed_messages"} 1.7672256e+09
pgdedup_oldest_processed_timestamp_seconds{consumer="emails",table="processed_messages"} 1.7672256105e+09
# HELP pgdedup_rows Rows in the dedup table, per consumer.
# TYPE pgdedup_rows gauge
pgdedup_rows{consumer="billing",table="processed_messages"} 3
pgdedup_rows{consumer="emails",table="processed_messages"} 2
# HELP pgdedup_stats_up 1 if the last read of the dedup table's stats succeeded, else 0.
# TYPE pgdedup_stats_up gauge
pgdedup_stats_up{table="processed_messages"} 1
`, strconv.FormatFloat(next, 'g', -1, 64))
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), perConsumer...); err != nil {
		t.Errorf("after the inserts: %v", err)
	}
	sizes := gather(t, c)
	if sizes["pgdedup_table_size_bytes"] <= 0 || sizes["pgdedup_indexes_size_bytes"] <= 0 {
		t.Errorf("sizes: %v", sizes)
	}

	deleted, err := store.Cleanup(ctx)
	if err != nil || deleted != 3 {
		t.Fatalf("cleanup: %d, %v", deleted, err)
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP pgdedup_expired_rows Rows past their expires_at, per consumer: the next cleanup deletes them.
# TYPE pgdedup_expired_rows gauge
pgdedup_expired_rows{consumer="billing",table="processed_messages"} 0
# HELP pgdedup_rows Rows in the dedup table, per consumer.
# TYPE pgdedup_rows gauge
pgdedup_rows{consumer="billing",table="processed_messages"} 2
`), "pgdedup_rows", "pgdedup_expired_rows"); err != nil {
		t.Errorf("after cleanup: %v", err)
	}
}

// Indexes, dead tuples and vacuums are exported as Stats reads them.
func TestCollectorExportsIndexesAndVacuum(t *testing.T) {
	t.Parallel()
	db := pgdeduptest.New(t)
	ctx := context.Background()
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	c := pgdedupprom.NewCollector(store, pgdedupprom.Options{MaxAge: -1}) // every scrape reads
	if _, err := db.Pool.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, expires_at)
SELECT 'billing', 'm' || g, now() - interval '1 minute' FROM generate_series(1, 100) g`); err != nil {
		t.Fatal(err)
	}
	if _, ok := gather(t, c)["pgdedup_last_vacuum_timestamp_seconds"]; ok {
		t.Errorf("a table never vacuumed has a last vacuum")
	}
	if _, err := store.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	var before time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT now()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `VACUUM processed_messages`); err != nil {
		t.Fatal(err)
	}

	st, err := store.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Indexes) == 0 {
		t.Fatal("Stats lists no index")
	}
	var want strings.Builder
	want.WriteString("# HELP pgdedup_index_size_bytes Size of one index of the dedup table.\n# TYPE pgdedup_index_size_bytes gauge\n")
	for _, ix := range st.Indexes {
		fmt.Fprintf(&want, "pgdedup_index_size_bytes{index=%q,method=%q,table=\"processed_messages\"} %d\n", ix.Name, ix.Method, ix.Bytes)
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want.String()), "pgdedup_index_size_bytes"); err != nil {
		t.Error(err)
	}
	got := gather(t, c)
	if last := got["pgdedup_last_vacuum_timestamp_seconds"]; last < float64(before.Unix()) || last > float64(time.Now().Add(time.Minute).Unix()) {
		t.Errorf("last vacuum at %v, want just after %v", last, before)
	}
	if dead, ok := got["pgdedup_dead_tuples"]; !ok || dead < 0 {
		t.Errorf("dead tuples: %v (exported %v)", dead, ok)
	}
	var sum float64
	for _, ix := range st.Indexes {
		sum += float64(ix.Bytes)
	}
	if sum != got["pgdedup_indexes_size_bytes"] {
		t.Errorf("index sizes add up to %v, pgdedup_indexes_size_bytes is %v", sum, got["pgdedup_indexes_size_bytes"])
	}
}

// A read that fails is pgdedup_stats_up 0, logged, and nothing else. The
// scrape itself succeeds.
func TestCollectorReportsAFailedRead(t *testing.T) {
	t.Parallel()
	db := pgdeduptest.New(t)
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing", Table: "ops.nowhere"})
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	c := pgdedupprom.NewCollector(store, pgdedupprom.Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP pgdedup_stats_up 1 if the last read of the dedup table's stats succeeded, else 0.
# TYPE pgdedup_stats_up gauge
pgdedup_stats_up{table="ops.nowhere"} 0
`)); err != nil {
		t.Error(err)
	}
	if !strings.Contains(log.String(), "table not found") {
		t.Errorf("log: %s", log.String())
	}
}

// With MaxAge, scrapes within it reuse the last read. A negative MaxAge
// reads on every scrape.
func TestCollectorMaxAgeReusesARead(t *testing.T) {
	t.Parallel()
	db := pgdeduptest.New(t)
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	if pgdedupprom.DefaultMaxAge < 30*time.Second {
		t.Fatalf("DefaultMaxAge %v: less than the usual scrape intervals", pgdedupprom.DefaultMaxAge)
	}
	cached := pgdedupprom.NewCollector(store, pgdedupprom.Options{MaxAge: time.Hour})
	fresh := pgdedupprom.NewCollector(store, pgdedupprom.Options{MaxAge: -1})
	_ = gather(t, cached)
	noop := func(context.Context, pgx.Tx) error { return nil }
	if _, err := store.Process(context.Background(), "a", noop); err != nil {
		t.Fatal(err)
	}
	if got := gather(t, cached)["pgdedup_rows"]; got != 0 {
		t.Errorf("collector with MaxAge 1h: %v rows, want the first read's 0", got)
	}
	if got := gather(t, fresh)["pgdedup_rows"]; got != 1 {
		t.Errorf("collector with MaxAge -1: %v rows, want 1", got)
	}
}

// The default reuses a read, so there is one scan of the table per
// DefaultMaxAge however many scrapes, counted on the wire.
func TestCollectorDefaultMaxAgeReadsOnce(t *testing.T) {
	t.Parallel()
	db := pgdeduptest.New(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	reads := &statsReads{}
	cfg.ConnConfig.Tracer = reads
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	c := pgdedupprom.NewCollector(store, pgdedupprom.Options{})
	start := time.Now()
	const scrapes = 6
	for range scrapes {
		_ = gather(t, c)
	}
	// There is one read per DefaultMaxAge begun. That is 1 unless this machine
	// took a minute for the scrapes, so the bound holds however slow it is.
	if got, most := reads.n.Load(), int64(time.Since(start)/pgdedupprom.DefaultMaxAge)+1; got < 1 || got > most {
		t.Errorf("%d scrapes read the table %d times, want at most %d", scrapes, got, most)
	}
}

// statsReads counts the queries that read the table's consumers, one per
// Store.Stats.
type statsReads struct{ n atomic.Int64 }

func (r *statsReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "GROUP BY consumer") {
		r.n.Add(1)
	}
	return ctx
}

func (r *statsReads) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// gather registers c alone and sums each metric's series.
func gather(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			out[mf.GetName()] += m.GetGauge().GetValue()
		}
	}
	return out
}

// On the partitioned layout the runway is the time until claims would find
// no partition. It is a few spans ahead after Setup, and it falls while no
// cleaner runs.
func TestCollectorExportsTheRunway(t *testing.T) {
	t.Parallel()
	db := pgdeduptest.New(t)
	ctx := context.Background()
	span := 2 * time.Second
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing", Retention: 12 * span, Layout: pgdedup.LayoutPartitioned})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	c := pgdedupprom.NewCollector(store, pgdedupprom.Options{MaxAge: -1})
	first, ok := gather(t, c)["pgdedup_partition_runway_seconds"]
	if !ok || first <= span.Seconds() || first > 10*span.Seconds() {
		t.Fatalf("runway after Setup = %v (exported: %v), want more than one span of %s and less than ten", first, ok, span)
	}
	time.Sleep(span)
	if later := gather(t, c)["pgdedup_partition_runway_seconds"]; later >= first {
		t.Errorf("runway %v a span later without a cleaner, want less than %v", later, first)
	}
	plain, err := pgdedup.New(pgdeduptest.New(t).Pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := gather(t, pgdedupprom.NewCollector(plain, pgdedupprom.Options{MaxAge: -1}))["pgdedup_partition_runway_seconds"]; ok {
		t.Error("a plain table exports a runway")
	}
}
