package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// TestPostgresRestart restarts a throwaway cluster under load, once with
// pg_ctl restart -m fast and once with -m immediate (a crash: no checkpoint,
// WAL recovery at start), while consumers take messages from a queue table in
// it. During each outage Process returns errors and the message is not acked;
// afterwards processing resumes. Every message must end with exactly one
// effect and the queue must be empty.
//
// The server is down for a few hundred milliseconds each time: consumers that
// hold messages then get errors from Process and leave them unacked; the
// others fail to receive until it is back.
//
// On both layouts, one after the other (the partitioned one switching
// partitions every span).
func TestPostgresRestart(t *testing.T) {
	for _, layout := range layouts {
		t.Run(layout, func(t *testing.T) { testPostgresRestart(t, layout) })
	}
}

func testPostgresRestart(t *testing.T, layout string) {
	const workers = 4
	n := scaled(1500)
	ctx := testCtx(t, 5*time.Minute) // a hang guard, not a time limit
	cluster := pgtest.StartCluster(t)
	cfg, err := pgxpool.ParseConfig(cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = workers + 4 // consumers, the cleaner and the short-lived producer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	err = pgdedup.Migrate(ctx, sqlDB)
	sqlDB.Close()
	if err != nil {
		t.Fatal(err)
	}
	q, err := NewQueue(ctx, pool, "queue", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := NewLedger(ctx, pool, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	ids := messageIDs("restart", n)
	if err := q.Enqueue(ctx, ids); err != nil {
		t.Fatal(err)
	}
	cleaner := StartCleanerLoad(t, pool, layout)
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "restart", SentAtMargin: sentAtMargin})
	sent := time.Now() // the messages were enqueued just before
	if err != nil {
		t.Fatal(err)
	}

	var acked, processErrs, queueErrs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() { consumeUntilEmpty(ctx, q, store, ledger, sent, stop, &acked, &processErrs, &queueErrs) })
	}
	start := time.Now()
	var restartedAt time.Time
	var outages []string
	modes := []string{"fast", "immediate"}
	if soak() {
		modes = slices.Repeat(modes, 5)
	}
	for _, mode := range modes {
		waitFor(ctx, func() bool { return acked.Load() >= int64(n)*int64(len(outages)+1)/int64(len(modes)+1) })
		processBefore, queueBefore := processErrs.Load(), queueErrs.Load()
		t0 := time.Now()
		if err := cluster.Restart(mode); err != nil {
			t.Fatal(err)
		}
		restartedAt = time.Now()
		// Let the consumers meet the dead connections before counting.
		time.Sleep(200 * time.Millisecond)
		pe, qe := processErrs.Load()-processBefore, queueErrs.Load()-queueBefore
		outages = append(outages, fmt.Sprintf("%s:%s/process_errors=%d/queue_errors=%d", mode, restartedAt.Sub(t0).Round(time.Millisecond), pe, qe))
		if pe+qe == 0 {
			t.Errorf("restart -m %s: the consumers saw no error", mode)
		}
	}
	waitFor(ctx, func() bool { n, err := q.Len(ctx); return err == nil && n == 0 })
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)

	tally, err := ledger.Tally(ctx, pool, ids)
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := q.Deliveries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURES restart %s: %s deliveries=%d restarts=%s process_errors=%d queue_errors=%d in %s",
		layout, tally, deliveries, strings.Join(outages, ","), processErrs.Load(), queueErrs.Load(), elapsed.Round(time.Millisecond))
	assertExactlyOnce(t, tally)
	// Whether a consumer was inside Process when the server went away is down
	// to timing at each restart, but not over all of them.
	if processErrs.Load() == 0 {
		t.Errorf("Process returned no error during %d restarts", len(modes))
	}
	// Every message was acked: the queue is empty. An ack whose COMMIT landed
	// as the server went away reports an error although it took effect, so
	// the acks the consumers saw succeed can fall short of n, never exceed it.
	if left, err := q.Len(ctx); err != nil || left != 0 || acked.Load() > int64(n) {
		t.Errorf("%d messages left unacked (%v); %d acks succeeded, want at most %d", left, err, acked.Load(), n)
	}
	waitFor(ctx, func() bool { return cleaner.LastSuccess().After(restartedAt) })
	if !cleaner.LastSuccess().After(restartedAt) {
		t.Errorf("cleanup did not succeed after the last restart (last success %s, restart %s)", cleaner.LastSuccess(), restartedAt)
	}
	// Checked while the cleaner runs: it creates the partitions that the
	// check claims in.
	assertStillDuplicates(t, pool, "restart", ids, cleaner, sent)
	cleaner.Stop(t)
}

// consumeUntilEmpty is one consumer: it receives up to 10 messages at a time,
// processes each and acks it only when Process succeeded; a failed message
// stays in the queue and comes back after the visibility timeout.
func consumeUntilEmpty(ctx context.Context, q *Queue, store *pgdedup.Store, ledger *Ledger, sent time.Time, stop <-chan struct{}, acked, processErrs, queueErrs *atomic.Int64) {
	pause := func() {
		select {
		case <-stop:
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		batch, err := q.Receive(ctx, 10)
		if err != nil {
			queueErrs.Add(1)
			pause()
			continue
		}
		if len(batch) == 0 {
			pause()
			continue
		}
		for _, id := range batch {
			_, err := store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
				return ledger.Write(ctx, tx, id)
			}, pgdedup.WithSentAt(sent))
			if err != nil {
				processErrs.Add(1)
				continue
			}
			if err := q.Ack(ctx, id); err != nil {
				queueErrs.Add(1)
				continue
			}
			acked.Add(1)
		}
	}
}

// waitFor polls cond every 10ms until it holds or ctx is done.
func waitFor(ctx context.Context, cond func() bool) {
	for !cond() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}
