package main

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// testConfig is a run small enough for CI against the test database
// (TEST_DATABASE_URL or DATABASE_URL) and Redis (REDIS_ADDR or the default).
func testConfig(t *testing.T) config {
	t.Helper()
	url := cmp.Or(os.Getenv("TEST_DATABASE_URL"), os.Getenv("DATABASE_URL"))
	if url == "" {
		t.Fatal("set TEST_DATABASE_URL (or DATABASE_URL) to a PostgreSQL database for the bench tests")
	}
	cfg, err := parseFlags([]string{"-database-url", url, "-workers", "1,2", "-rounds", "1", "-round", "20ms",
		"-cleanup-rows", "3000", "-cleanup-baseline", "50ms"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg.accountMessages, cfg.accountReps = 50, 1
	return cfg
}

// The round trips per message are the performance contract of DESIGN.md:
// Process of a new message costs what the bare transaction costs, a duplicate
// two, Claim one more than bare, the Redis recipe one Redis trip more.
func TestRoundTripsPerMessage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := newBench(ctx, testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	costs, walMethod, err := b.account(ctx, newProgress(io.Discard, 0))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]float64{ // Postgres, Redis
		bareTx.key: {3, 0}, pipelineTx.key: {3, 0}, processTx.key: {3, 0},
		claimTx.key: {4, 0}, redisTx.key: {3, 1}, dupTx.key: {2, 0},
	}
	for key, w := range want {
		if c := costs[key]; c.pgRT != w[0] || c.redisRT != w[1] {
			t.Errorf("%s: %.2f Postgres and %.2f Redis round trips per message, want %.0f and %.0f", key, c.pgRT, c.redisRT, w[0], w[1])
		}
	}
	// Measured exactly (the messages' own transactions) when pg_walinspect is
	// there: a duplicate writes nothing, a claim writes its row.
	if strings.Contains(walMethod, "pg_walinspect") {
		if dup := costs[dupTx.key].walBytes; dup != 0 {
			t.Errorf("the duplicate path wrote %.0f WAL bytes per message, want none", dup)
		}
		if p, bare := costs[processTx.key].walBytes, costs[bareTx.key].walBytes; p <= bare {
			t.Errorf("Process wrote %.0f WAL bytes per message, not more than the bare transaction's %.0f", p, bare)
		}
	}
}

// A whole (tiny) run prints every table, writes -o, and leaves no schema.
func TestRunPrintsEveryTableAndCleansUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := testConfig(t)
	cfg.out = filepath.Join(t.TempDir(), "bench.md")
	schemas := schemaCounter(ctx, t, cfg.databaseURL, "pgdedup_bench_")
	before := schemas()
	var out bytes.Buffer
	if err := run(ctx, cfg, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"### Round trips and WAL", "### Messages, loopback", "### Messages, +250µs each way",
		"### ClaimBatch", "### Cleanup", "### Targets", "| Store.Process | ", "2 workers: msgs/s", "| 1,000 | 50% | ", "Load average", "Written by `go run -C bench . ", "RAM", "Toy proportions"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if file, err := os.ReadFile(cfg.out); err != nil || !bytes.Equal(file, out.Bytes()) {
		t.Errorf("-o file differs from stdout (err %v)", err)
	}
	if after := schemas(); after != before {
		t.Errorf("%d pgdedup_bench_ schemas before the run, %d after", before, after)
	}
}

// The citus part runs against the cluster of TEST_CITUS_URL (.ci/citus.sh),
// prints its section and targets, and leaves no schema on either server.
func TestCitusPart(t *testing.T) {
	citusURL := os.Getenv("TEST_CITUS_URL")
	if citusURL == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("TEST_CITUS_URL is not set: CI must run the Citus part (.ci/citus.sh)")
		}
		t.Skip("TEST_CITUS_URL is not set (see .ci/citus.sh)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := testConfig(t)
	cfg.only, cfg.citusURL, cfg.citusShards, cfg.workers = []string{"citus"}, citusURL, 4, []int{2}
	var out bytes.Buffer
	if err := run(ctx, cfg, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"### Citus (", "| Citus, business row co-located with the claim | ", "| Citus: ClaimBatch (multi-row VALUES",
		"| Citus, co-located, the Partitioned layout (docs/partitioning.md) | ",
		"| Citus, co-located, the Partitioned layout, with a time (`WithSentAt(time.Now())`, `SentAtMargin` 1ms: a fresh claim, one routed `INSERT`) | ",
		"| Citus, co-located, the Partitioned layout, with a time 1ms before the current partition (a read of `sealed`, a routed look-up in the partition before, the routed `INSERT`) | ",
		"| Citus, Partitioned layout: ClaimBatch",
		"| Citus: Cleanup (windows", "Citus: before (the batch that picks rows by ctid) | fails: ", "| Citus: Cleanup rows/s |"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	conn, err := pgx.Connect(ctx, citusURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'pgdedup\_bench\_citus\_%'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d pgdedup_bench_citus_ schemas left on Citus (%v)", n, err)
	}
}

// schemaCounter connects to url and returns a func counting the schemas whose
// name starts with prefix (a part's own), to check that a run leaves none
// behind.
func schemaCounter(ctx context.Context, t *testing.T, url, prefix string) func() int {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	pattern := strings.ReplaceAll(prefix, "_", `\_`) + "%"
	return func() (n int) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1`, pattern).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
}
