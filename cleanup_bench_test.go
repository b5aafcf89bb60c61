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
		b.Run(name, func(b *testing.B) { benchCleanup(b, rows, oldSnapshot, nil) })
	}
	// The same, side by side, with batches that each start from
	// the beginning of the expires_at index instead of where the previous one
	// ended: what Cleanup's resuming saves.
	b.Run("quiet-restarting", func(b *testing.B) { benchCleanup(b, rows, false, restartingCleanup) })
	b.Run("old-snapshot-restarting", func(b *testing.B) { benchCleanup(b, rows, true, restartingCleanup) })
}

// restartingCleanup is Cleanup without the resume point: every batch scans the
// index from its start, over the entries of the rows deleted before it.
func restartingCleanup(ctx context.Context, db *pgtest.DB, log *slog.Logger) (int64, error) {
	var deleted int64
	for {
		start := time.Now()
		tag, err := db.Pool.Exec(ctx, `DELETE FROM processed_messages WHERE ctid = ANY (ARRAY(
SELECT ctid FROM processed_messages WHERE expires_at < now() ORDER BY expires_at LIMIT 10000))
AND expires_at < now()`)
		if err != nil {
			return deleted, err
		}
		deleted += tag.RowsAffected()
		log.Debug("pgdedup: cleanup batch", "deleted", tag.RowsAffected(), "duration", time.Since(start))
		if tag.RowsAffected() < 10_000 {
			return deleted, nil
		}
	}
}

func benchCleanup(b *testing.B, rows int, oldSnapshot bool,
	cleanup func(context.Context, *pgtest.DB, *slog.Logger) (int64, error)) {
	db := pgtest.New(b)
	sink := &logSink{}
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "bench", Logger: slog.New(sink)})
	if err != nil {
		b.Fatal(err)
	}
	if cleanup == nil {
		cleanup = func(ctx context.Context, _ *pgtest.DB, _ *slog.Logger) (int64, error) { return store.Cleanup(ctx) }
	}
	ctx := context.Background()
	var deleted int64
	var spent time.Duration
	for range b.N {
		b.StopTimer()
		pgtest.Seed(b, db.Pool, "bench", "old-", rows, -time.Hour)
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
		n, err := cleanup(ctx, db, slog.New(sink))
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
