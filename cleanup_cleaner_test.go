package pgdedup_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// The RunCleaner tests are not parallel: goleak looks at every goroutine of
// the test binary, and parallel tests run only after the sequential ones.

// A failed run (here: the table does not exist yet) does not end the loop:
// once the table is there, the next tick cleans it. Cancelling ctx stops the
// loop at once, with ctx.Err(), and leaves no goroutine behind.
func TestRunCleanerSurvivesFailuresAndStops(t *testing.T) {
	b := setup(t, pgdedup.Config{})
	conn := connect(t, b.db.URL) // no pool: no background goroutines of its own
	runs := make(chan pgdedup.Event, 1000)
	store, err := pgdedup.New(conn, pgdedup.Config{Consumer: "billing", Table: "later_table",
		OnEvent: func(_ context.Context, e pgdedup.Event) { runs <- e }})
	if err != nil {
		t.Fatal(err)
	}
	ignore := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(ctxT(t))
	stopped := make(chan error, 1)
	go func() { stopped <- store.RunCleaner(ctx, 10*time.Millisecond) }()

	for range 2 {
		var pgErr *pgconn.PgError
		if e := next(t, runs); !errors.As(e.Err, &pgErr) || pgErr.Code != "42P01" {
			t.Fatalf("run on a missing table: %+v, want undefined_table", e)
		}
	}
	mustExec(t, b.pool, `BEGIN;
CREATE TABLE later_table (LIKE processed_messages INCLUDING ALL);
INSERT INTO later_table (consumer, message_id, expires_at)
SELECT 'billing', 'id-' || g, now() - interval '1 hour' FROM generate_series(1, 100) g;
COMMIT`)
	for i := 0; ; i++ {
		e := next(t, runs)
		if e.Err == nil && e.Count > 0 {
			if e.Count != 100 {
				t.Errorf("the first successful run deleted %d rows, want 100", e.Count)
			}
			break
		}
		if i == 500 {
			t.Fatalf("no successful run after the table was created; last: %+v", e)
		}
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM later_table`); n != 0 {
		t.Errorf("%d rows left after a successful run", n)
	}

	cancel()
	stopsPromptly(t, stopped)
	goleak.VerifyNone(t, ignore)
}

// Cancelling ctx in the middle of a long Cleanup stops RunCleaner promptly too;
// the batches committed before stay deleted.
func TestRunCleanerStopsMidRun(t *testing.T) {
	ctx, cancel := context.WithCancel(ctxT(t))
	sink := &logSink{}
	batches := make(chan int64, 1)
	sink.onBatch = func(n int64) {
		select {
		case batches <- n:
		default:
		}
	}
	b := setup(t, pgdedup.Config{})
	pgtest.Seed(t, b.pool, "billing", "old-", 20_000, -time.Hour)
	conn := connect(t, b.db.URL)
	store, err := pgdedup.New(conn, pgdedup.Config{Consumer: "billing", CleanupBatchSize: 50, Logger: slog.New(sink)})
	if err != nil {
		t.Fatal(err)
	}
	ignore := goleak.IgnoreCurrent()
	stopped := make(chan error, 1)
	go func() { stopped <- store.RunCleaner(ctx, time.Millisecond) }()
	select {
	case <-batches:
	case err := <-stopped:
		t.Fatalf("RunCleaner returned %v before its first batch", err)
	}
	cancel()
	stopsPromptly(t, stopped)
	goleak.VerifyNone(t, ignore)

	left := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`)
	var done int64
	for _, n := range sink.batches() {
		done += n
	}
	// The batch in flight when ctx was cancelled may have committed or not.
	if left == 0 || int64(left) > 20_000-done || int64(left) < 20_000-done-50 {
		t.Errorf("%d rows left after batches that deleted %d, want 20000-%[2]d or one batch of 50 fewer, and some left", left, done)
	}
}

func TestRunCleanerRejectsBadInterval(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	for _, d := range []time.Duration{0, -time.Second} {
		if err := b.store.RunCleaner(context.Background(), d); err == nil {
			t.Errorf("RunCleaner(%s) = nil, want an error", d)
		}
	}
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctxT(t), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// next returns the next cleanup run reported, failing after 10 seconds.
func next(t *testing.T, runs <-chan pgdedup.Event) pgdedup.Event {
	t.Helper()
	select {
	case e := <-runs:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no cleanup run within 10s")
		return pgdedup.Event{}
	}
}

// stopsPromptly checks that RunCleaner returned context.Canceled within a
// second of its ctx being cancelled.
func stopsPromptly(t *testing.T, stopped <-chan error) {
	t.Helper()
	select {
	case err := <-stopped:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("RunCleaner returned %v, want context.Canceled", err)
		}
	case <-time.After(time.Second):
		t.Fatal("RunCleaner still running 1s after its ctx was cancelled")
	}
}
