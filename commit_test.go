package pgdedup_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// proxiedStore returns a Store whose pool goes through a proxy, and the proxy.
func proxiedStore(t *testing.T, b *bundle, cfg pgdedup.Config, maxConns int32) (*pgdedup.Store, *pgtest.Proxy, *pgxpool.Pool) {
	t.Helper()
	proxy := pgtest.NewProxy(t, b.db.URL)
	pcfg, err := pgxpool.ParseConfig(proxy.URL(b.db.URL))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = maxConns
	pcfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg.Consumer = "billing"
	store, err := pgdedup.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return store, proxy, pool
}

// The connection is cut right after COMMIT is sent, before its reply: the
// outcome is unknown to the client. Whether the commit landed (forwarded) or
// not, the retry leaves exactly one charge.
func TestProcessRetriesAmbiguousCommit(t *testing.T) {
	t.Parallel()
	for _, forward := range []bool{true, false} {
		t.Run(fmt.Sprintf("commit reaches server=%v", forward), func(t *testing.T) {
			t.Parallel()
			b := setup(t, pgdedup.Config{})
			store, proxy, _ := proxiedStore(t, b, pgdedup.Config{MaxAttempts: 5}, 8)
			ctx := ctxT(t)
			const msgs, cuts = 40, 10
			proxy.CutCommits(cuts, forward)

			var wg sync.WaitGroup
			errs := make(chan error, msgs)
			for i := range msgs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					id := fmt.Sprintf("msg-%d", i)
					if _, err := store.Process(ctx, id, charge(id)); err != nil {
						errs <- fmt.Errorf("%s: %w", id, err)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if proxy.Cut() != cuts {
				t.Fatalf("%d commits cut, want %d", proxy.Cut(), cuts)
			}
			got := chargesPerOrder(t, b.pool)
			for i := range msgs {
				id := fmt.Sprintf("msg-%d", i)
				if got[id] != 1 {
					t.Errorf("%s charged %d times, want 1", id, got[id])
				}
			}
		})
	}
}

// Round trips, counted on the wire after the statements are prepared: a new
// message costs what the bare transaction costs (BEGIN+claim, fn's insert,
// COMMIT = 3), a duplicate 2, Claim and ClaimBatch one each.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	store, proxy, pool := proxiedStore(t, b, pgdedup.Config{}, 1)
	ctx := ctxT(t)

	measure := func(f func() error) int64 {
		t.Helper()
		before := proxy.RoundTrips()
		if err := f(); err != nil {
			t.Fatal(err)
		}
		return proxy.RoundTrips() - before
	}
	n := 0
	process := func() error { n++; _, err := store.Process(ctx, fmt.Sprint("m", n), charge("o")); return err }
	bare := func() error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		if err := charge("o")(ctx, tx); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	duplicate := func() error { _, err := store.Process(ctx, "m1", charge("o")); return err }
	for range 2 { // warm up: prepare statements on the single connection
		_ = process()
		_ = bare()
		_ = duplicate()
	}
	if got, want := measure(process), measure(bare); got != want || got != 3 {
		t.Errorf("Process of a new message: %d round trips, bare transaction: %d; want both 3", got, want)
	}
	if got := measure(duplicate); got != 2 {
		t.Errorf("Process of a duplicate: %d round trips, want 2", got)
	}
	// LockTimeout adds statements to the pipeline, not round trips.
	bounded, err := pgdedup.New(pool, pgdedup.Config{Consumer: "bounded", LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	processBounded := func() error { n++; _, err := bounded.Process(ctx, fmt.Sprint("m", n), charge("o")); return err }
	_, _ = processBounded(), processBounded()
	if got := measure(processBounded); got != 3 {
		t.Errorf("Process with LockTimeout: %d round trips, want 3", got)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	warm := make([]string, 1000) // a batch of the measured size: Citus claims it as VALUES of 1024 rows
	for i := range warm {
		warm[i] = fmt.Sprint("warm", i)
	}
	for range 2 {
		_, _ = store.Claim(ctx, tx, "warm")
		_, _ = store.ClaimBatch(ctx, tx, warm)
	}
	if got := measure(func() error { _, err := store.Claim(ctx, tx, "c1"); return err }); got != 1 {
		t.Errorf("Claim: %d round trips, want 1", got)
	}
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprint("b", i)
	}
	if got := measure(func() error { _, err := store.ClaimBatch(ctx, tx, ids); return err }); got != 1 {
		t.Errorf("ClaimBatch of 1000: %d round trips, want 1", got)
	}
}
