package faults

import (
	"context"
	"math/rand/v2"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// TestAmbiguousCommit runs concurrent consumers through a proxy that cuts one
// connection in three around COMMIT: half after forwarding it and before the
// reply (the commit landed, the client cannot know), half before forwarding it
// (the transaction rolled back). Process retries; every message must end with
// exactly one effect, and every commit cut after landing must come back as a
// duplicate on retry.
func TestAmbiguousCommit(t *testing.T) {
	const workers = 8
	n := scaled(800)
	ctx := testCtx(t, 60*time.Second)
	db := pgtest.New(t)
	ledger, err := NewLedger(ctx, db.Pool, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	cleaner := StartCleanerLoad(t, db.Pool)

	proxy, err := NewCommitCutter(hostPort(t, db.URL), func() Cut {
		switch r := rand.Float64(); {
		case r < 1.0/6:
			return CutAfterCommit
		case r < 2.0/6:
			return CutBeforeCommit
		}
		return Forward
	})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	pool := proxiedPool(t, db.URL, proxy.Addr(), workers)
	var retries atomic.Int64
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "ambiguous", MaxAttempts: 5,
		OnEvent: func(_ context.Context, e pgdedup.Event) {
			if e.Kind == pgdedup.EventRetry {
				retries.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}

	ids := messageIDs("ambiguous", n)
	work := make(chan string)
	var processed, duplicates, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for id := range work {
				// Deliver until Process succeeds, as a broker redelivers a nacked message.
				for ctx.Err() == nil {
					ok, err := store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
						return ledger.Write(ctx, tx, id)
					})
					if err != nil {
						failed.Add(1)
						continue
					}
					if ok {
						processed.Add(1)
					} else {
						duplicates.Add(1)
					}
					break
				}
			}
		})
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)

	tally, err := ledger.Tally(ctx, db.Pool, ids)
	if err != nil {
		t.Fatal(err)
	}
	st := proxy.Stats()
	t.Logf("FIGURES ambiguous-commit: %s commits=%d cut_after_commit=%d cut_before_commit=%d retries=%d process_errors=%d processed=%d reported_duplicate=%d in %s",
		tally, st.Commits, st.CutAfter, st.CutBefore, retries.Load(), failed.Load(), processed.Load(), duplicates.Load(), elapsed.Round(time.Millisecond))
	assertExactlyOnce(t, tally)
	if st.CutAfter == 0 || st.CutBefore == 0 {
		t.Errorf("the proxy cut no COMMIT (%+v): the scenario injected no fault", st)
	}
	// A commit cut after it landed is found by the retry: Process reports the
	// message as a duplicate. Nothing else is delivered twice here.
	if duplicates.Load() != st.CutAfter {
		t.Errorf("%d deliveries reported a duplicate, want one per commit cut after landing (%d)", duplicates.Load(), st.CutAfter)
	}
	cleaner.Stop(t)
	assertStillDuplicates(t, db.Pool, "ambiguous", ids)
}

// hostPort returns the host:port of a database URL.
func hostPort(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "5432")
	}
	return u.Host
}

// proxiedPool is a pool on dbURL that connects through addr instead.
func proxiedPool(t *testing.T, dbURL, addr string, size int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(addr)
	cfg.ConnConfig.Host = host
	cfg.ConnConfig.Port = uint16(mustAtoi(t, port))
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.TLSConfig = nil
	cfg.MaxConns = size
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
