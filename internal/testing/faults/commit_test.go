package faults

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
	"github.com/pgdedup/pgdedup/internal/wireproxy"
)

// TestAmbiguousCommit runs concurrent consumers through a proxy that cuts one
// connection in three around COMMIT: half after forwarding it and before the
// reply (the commit landed, the client cannot know), half before forwarding it
// (the transaction rolled back). Process and ProcessBatch retry; every message
// must end with exactly one effect, and every commit cut after landing must come
// back as a duplicate on retry. On both layouts (the partitioned one switching
// partitions every span).
func TestAmbiguousCommit(t *testing.T) {
	for _, layout := range layouts {
		t.Run(layout, func(t *testing.T) {
			t.Run("Process", func(t *testing.T) {
				testAmbiguousCommit(t, layout, 800, 1, func(ctx context.Context, store *pgdedup.Store, ledger *Ledger, ids []string, sent time.Time) (int, error) {
					ok, err := store.Process(ctx, ids[0], func(ctx context.Context, tx pgx.Tx) error {
						return ledger.Write(ctx, tx, ids[0])
					}, pgdedup.WithSentAt(sent))
					if ok {
						return 1, err
					}
					return 0, err
				})
			})
			t.Run("ProcessBatch", func(t *testing.T) {
				testAmbiguousCommit(t, layout, 2000, 5, func(ctx context.Context, store *pgdedup.Store, ledger *Ledger, ids []string, _ time.Time) (int, error) {
					fresh, err := store.ProcessBatch(ctx, ids, func(ctx context.Context, tx pgx.Tx, fresh []string) error {
						for _, id := range fresh {
							if err := ledger.Write(ctx, tx, id); err != nil {
								return err
							}
						}
						return nil
					})
					return len(fresh), err
				})
			})
		})
	}
}

// deliverFunc delivers a batch of messages, sent at sent, once and returns
// how many were new.
type deliverFunc func(ctx context.Context, store *pgdedup.Store, ledger *Ledger, ids []string, sent time.Time) (fresh int, err error)

// testAmbiguousCommit delivers n messages, batch at a time, on a table of
// layout.
func testAmbiguousCommit(t *testing.T, layout string, n, batch int, deliver deliverFunc) {
	const workers = 8
	n = scaled(n)
	ctx := testCtx(t, 5*time.Minute) // a hang guard, not a time limit
	sent := time.Now()               // when every message is sent
	db := pgtest.New(t)
	ledger, err := NewLedger(ctx, db.Pool, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	cleaner := StartCleanerLoad(t, db.Pool, layout)

	proxy, proxied := pgtest.NewProxy(t, db.URL, wireproxy.Config{Decide: func() wireproxy.Cut {
		switch r := rand.Float64(); {
		case r < 1.0/6:
			return wireproxy.CutAfterCommit
		case r < 2.0/6:
			return wireproxy.CutBeforeCommit
		}
		return wireproxy.Forward
	}})
	pool := pgtest.Pool(t, proxied, workers)
	var retries atomic.Int64
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "ambiguous", MaxAttempts: 5, SentAtMargin: sentAtMargin,
		OnEvent: func(_ context.Context, e pgdedup.Event) {
			if e.Kind == pgdedup.EventRetry {
				retries.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}

	ids := messageIDs("ambiguous", n)
	work := make(chan []string)
	var processed, allDuplicate atomic.Int64
	var failed errLog // the errors deliveries returned
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for chunk := range work {
				// Deliver until it succeeds, as a broker redelivers a nacked message.
				for ctx.Err() == nil {
					fresh, err := deliver(ctx, store, ledger, chunk, sent)
					if err != nil {
						failed.add(err)
						continue
					}
					processed.Add(int64(fresh))
					if fresh == 0 {
						allDuplicate.Add(1)
					}
					break
				}
			}
		})
	}
	for i := 0; i < n; i += batch {
		work <- ids[i:min(i+batch, n)]
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)

	failed.log(t)
	tally, err := ledger.Tally(ctx, db.Pool, ids)
	if err != nil {
		t.Fatal(err)
	}
	st := proxy.Stats()
	t.Logf("FIGURES ambiguous-commit %s: %s commits=%d cut_after_commit=%d cut_before_commit=%d retries=%d errors_returned=%d processed=%d deliveries_reported_duplicate=%d in %s",
		t.Name(), tally, st.Commits, st.CutAfter, st.CutBefore, retries.Load(), failed.count(), processed.Load(), allDuplicate.Load(), elapsed.Round(time.Millisecond))
	assertExactlyOnce(t, tally)
	if st.CutAfter == 0 || st.CutBefore == 0 {
		t.Errorf("the proxy cut no COMMIT (%+v): the scenario injected no fault", st)
	}
	// A commit cut after it landed is found by the retry: the delivery reports
	// its messages as duplicates. Nothing else is delivered twice here.
	if allDuplicate.Load() != st.CutAfter {
		t.Errorf("%d deliveries found only duplicates, want one per commit cut after landing (%d)", allDuplicate.Load(), st.CutAfter)
	}
	// Checked while the cleaner runs: it creates the partitions that the
	// check claims in.
	assertStillDuplicates(t, db.Pool, "ambiguous", ids, cleaner, sent)
	cleaner.Stop(t)
}
