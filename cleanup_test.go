package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
	"github.com/pgdedup/pgdedup/internal/wireproxy"
)

// 200,000 expired rows of two consumers among live ones: exactly the expired
// ones go, in bounded batches, and a live ID is still a duplicate afterwards.
func TestCleanupDeletesExactlyTheExpired(t *testing.T) {
	t.Parallel()
	sink, events := &logSink{}, &eventLog{}
	b := setup(t, pgdedup.Config{Logger: slog.New(sink), OnEvent: events.add})
	ctx := ctxT(t)
	pgtest.Seed(t, b.pool, "billing", "old-", 120_000, -time.Hour)
	pgtest.Seed(t, b.pool, "emails", "old-", 80_000, -time.Hour)
	pgtest.Seed(t, b.pool, "billing", "edge-", 1, -time.Millisecond)
	pgtest.Seed(t, b.pool, "billing", "live-", 1_000, time.Hour)
	pgtest.Seed(t, b.pool, "emails", "live-", 1_000, 24*time.Hour)
	for i := range 5 {
		id := fmt.Sprint("order-", i)
		if ok, err := b.store.Process(ctx, id, charge(id)); err != nil || !ok {
			t.Fatalf("Process(%s) = %v, %v", id, ok, err)
		}
	}

	deleted, err := b.store.Cleanup(ctx)
	if err != nil || deleted != 200_001 {
		t.Fatalf("Cleanup = %d, %v; want 200001, nil", deleted, err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE expires_at < now()`); n != 0 {
		t.Errorf("%d expired rows left", n)
	}
	for consumer, want := range map[string]int{"billing": 1_005, "emails": 1_000} {
		if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE consumer = $1`, consumer); n != want {
			t.Errorf("%s: %d live rows left, want %d", consumer, n, want)
		}
	}
	for i := range 5 {
		id := fmt.Sprint("order-", i)
		if ok, err := b.store.Process(ctx, id, charge(id)); err != nil || ok {
			t.Errorf("Process(%s) after cleanup = %v, %v; want a duplicate", id, ok, err)
		}
		if n := chargesPerOrder(t, b.pool)[id]; n != 1 {
			t.Errorf("%s charged %d times", id, n)
		}
	}

	batches := sink.batches()
	if len(batches) != 21 && !citusBatches(t, batches, 10_000, 200_001) {
		t.Errorf("deleted in %d batches %v, want 20 of 10000 and 1 of 1", len(batches), batches)
	}
	for _, n := range batches {
		if n > 10_000 {
			t.Errorf("a batch deleted %d rows, more than the default 10000", n)
		}
	}
	runs := events.cleanups()
	if len(runs) != 1 || runs[0].Count != 200_001 || runs[0].Err != nil || runs[0].Duration <= 0 {
		t.Errorf("cleanup events = %+v; want one with Count 200001, a duration and no error", runs)
	}
	got := sink.Last("pgdedup: cleanup")
	if got == nil {
		t.Fatal("no info log of the cleanup")
	}
	if deleted, _ := pgtest.Attr(*got, "deleted"); deleted.Int64() != 200_001 {
		t.Errorf("the cleanup's log says %v rows deleted, want 200001", deleted)
	}
	if d, _ := pgtest.Attr(*got, "duration"); d.Duration() <= 0 {
		t.Errorf("the cleanup's log gives no duration: %v", *got)
	}
	if deleted, err := b.store.Cleanup(ctx); deleted != 0 || err != nil {
		t.Errorf("second Cleanup = %d, %v; want 0, nil", deleted, err)
	}
}

// Cancelling ctx stops Cleanup between batches; the committed batches stay
// deleted, and the next run takes the rest in batches of CleanupBatchSize.
func TestCleanupHonorsCtxBetweenBatches(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(ctxT(t))
	sink := &logSink{}
	sink.onBatch = func(int64) { cancel() }
	b := setup(t, pgdedup.Config{CleanupBatchSize: 1_000, Logger: slog.New(sink)})
	pgtest.Seed(t, b.pool, "billing", "old-", 5_500, -time.Hour)
	pgtest.Seed(t, b.pool, "billing", "live-", 10, time.Hour)

	first := int64(1_000)
	if pgtest.CitusColumn() != "" {
		first = 0 // on Citus, the first batch's size depends on how its window adapted
		sink.onBatch = func(n int64) { first = n; cancel() }
	}
	deleted, err := b.store.Cleanup(ctx)
	if !errors.Is(err, context.Canceled) || deleted != first || first < 1 || first > 1_000 {
		t.Fatalf("cancelled Cleanup = %d, %v; want one batch of 1000, context.Canceled", deleted, err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 5_510-int(first) {
		t.Fatalf("%d rows after the cancelled run, want %d: the first batch must stay deleted", n, 5_510-first)
	}

	sink.onBatch = nil
	deleted, err = b.store.Cleanup(ctxT(t))
	if err != nil || deleted != 5_500-first {
		t.Fatalf("Cleanup = %d, %v; want %d, nil", deleted, err, 5_500-first)
	}
	batches := sink.batches()
	if got, want := fmt.Sprint(batches), "[1000 1000 1000 1000 1000 500]"; got != want && !citusBatches(t, batches, 1_000, 5_500) {
		t.Errorf("batches %s, want %s", got, want)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 10 {
		t.Errorf("%d rows left, want the 10 live ones", n)
	}
}

// A batch's two statements (take the turn, delete) are one round trip and one
// implicit transaction in each of pgx's query modes, the simple protocol too:
// Cleanup deletes every expired row, in one round trip per batch once its
// statements are prepared, and leaves on its connection neither the turn nor
// its lock. Behind PgBouncer (TEST_PGBOUNCER) the modes that prepare
// statements are left out: PgBouncer < 1.21 cannot run them.
func TestCleanupInEveryQueryMode(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	modes := []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	if os.Getenv("TEST_PGBOUNCER") == "" {
		modes = append(modes, pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec)
	}
	proxy, proxied := pgtest.NewProxy(t, b.db.URL, wireproxy.Config{})
	for _, mode := range modes {
		cfg, err := pgx.ParseConfig(proxied)
		if err != nil {
			t.Fatal(err)
		}
		cfg.DefaultQueryExecMode = mode
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		store, err := pgdedup.New(conn, pgdedup.Config{Consumer: "billing", CleanupBatchSize: 100})
		if err != nil {
			t.Fatal(err)
		}
		pgtest.Seed(t, b.pool, "billing", "live-"+mode.String()+"-", 10, time.Hour)
		for run := range 2 { // the first prepares the statements, in the modes that do
			pgtest.Seed(t, b.pool, "billing", fmt.Sprintf("old-%s-%d-", mode, run), 250, -time.Hour)
			before := proxy.RoundTrips()
			if deleted, err := store.Cleanup(ctx); err != nil || deleted != 250 {
				t.Errorf("%s: Cleanup = %d, %v; want 250, nil", mode, deleted, err)
			}
			want := int64(3)
			if mode == pgx.QueryExecModeDescribeExec {
				want = 6 // it describes the statements first, for every query
			}
			if rt := proxy.RoundTrips() - before; run == 1 && rt != want {
				t.Errorf("%s: Cleanup of 3 batches took %d round trips, want %d", mode, rt, want)
			}
		}
		var turn string
		var locks int
		err = conn.QueryRow(ctx, `SELECT coalesce(current_setting('pgdedup.cleanup_turn', true), ''),
(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())`).Scan(&turn, &locks)
		if err != nil || turn == "true" || locks != 0 {
			t.Errorf("%s: after Cleanup the connection has turn %q and %d advisory locks (%v); want neither", mode, turn, locks, err)
		}
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE expires_at < now()`); n != 0 {
		t.Errorf("%d expired rows left", n)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 10*len(modes) {
		t.Errorf("%d rows left, want the %d live ones", n, 10*len(modes))
	}
}
