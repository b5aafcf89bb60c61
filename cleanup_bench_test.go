package pgdedup_test

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// BenchmarkCleanup measures one Cleanup of PGDEDUP_BENCH_ROWS expired rows
// (default 1,000,000) at the default batch size, and reports rows deleted per
// second and the time per batch, which is how long each batch holds its row
// locks. It is a one-off measurement, not part of the test suite:
//
//	go test -run '^$' -bench BenchmarkCleanup -benchtime 1x .
//
// "old-snapshot" keeps a repeatable-read transaction open meanwhile, as a
// report or a stuck session would: vacuum cannot remove the deleted rows, and
// every index scan from the start of the index would visit them again.
func BenchmarkCleanup(b *testing.B) {
	rows := 1_000_000
	if s := os.Getenv("PGDEDUP_BENCH_ROWS"); s != "" {
		var err error
		if rows, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	for _, oldSnapshot := range []bool{false, true} {
		name := "quiet"
		if oldSnapshot {
			name = "old-snapshot"
		}
		b.Run(name, func(b *testing.B) { benchCleanup(b, rows, oldSnapshot) })
	}
}

func benchCleanup(b *testing.B, rows int, oldSnapshot bool) {
	db := pgtest.New(b)
	sink := &logSink{}
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "bench", Logger: slog.New(sink)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var deleted int64
	var spent time.Duration
	for range b.N {
		b.StopTimer()
		seed(b, db.Pool, "bench", "old-", rows, -time.Hour)
		mustExec(b, db.Pool, `ANALYZE processed_messages`)
		var old pgx.Tx
		if oldSnapshot {
			if old, err = db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}); err != nil {
				b.Fatal(err)
			}
			mustExec(b, old, `SELECT count(*) FROM pg_class`) // takes the snapshot
		}
		b.StartTimer()
		start := time.Now()
		n, err := store.Cleanup(ctx)
		spent += time.Since(start)
		if old != nil {
			_ = old.Rollback(ctx)
		}
		if err != nil || n != int64(rows) {
			b.Fatalf("Cleanup = %d, %v; want %d", n, err, rows)
		}
		deleted += n
	}
	d := sink.batchDurations()
	slices.Sort(d)
	ms := func(q float64) float64 { return float64(d[int(q*float64(len(d)-1))]) / 1e6 }
	b.ReportMetric(float64(deleted)/spent.Seconds(), "rows/s")
	b.ReportMetric(ms(0.5), "ms/batch-p50")
	b.ReportMetric(ms(0.95), "ms/batch-p95")
	b.ReportMetric(ms(1), "ms/batch-max")
	b.ReportMetric(0, "ns/op")
}
