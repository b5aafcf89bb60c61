package pgdedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

func TestLookup(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{Retention: 5 * time.Hour})
	ctx := ctxT(t)
	if _, err := b.store.Process(ctx, "order-1", charge("order-1")); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := b.store.Lookup(ctx, "order-1")
	if err != nil || !ok {
		t.Fatalf("Lookup of a processed ID: %+v, %v, %v", rec, ok, err)
	}
	if d := rec.ExpiresAt.Sub(rec.ProcessedAt); d != 5*time.Hour || time.Since(rec.ProcessedAt).Abs() > time.Minute {
		t.Errorf("Lookup: processed %v, expires %v (after %v, want 5h)", rec.ProcessedAt, rec.ExpiresAt, d)
	}
	if rec, ok, err := b.store.Lookup(ctx, "order-2"); err != nil || ok || !rec.ProcessedAt.IsZero() {
		t.Errorf("Lookup of an unknown ID: %+v, %v, %v", rec, ok, err)
	}
	other, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "emails"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := other.Lookup(ctx, "order-1"); err != nil || ok {
		t.Errorf("Lookup under another consumer: %v, %v; want not recorded", ok, err)
	}
	if _, _, err := b.store.Lookup(ctx, ""); !errors.Is(err, pgdedup.ErrInvalidMessageID) {
		t.Errorf("Lookup of an empty ID: %v", err)
	}
}

func TestForget(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	if _, err := b.store.Process(ctx, "order-1", charge("order-1")); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.store.Forget(ctx, "order-1"); err != nil || !ok {
		t.Fatalf("Forget of a recorded ID: %v, %v", ok, err)
	}
	if recorded(t, b.pool, "billing", "order-1") {
		t.Error("order-1 still recorded after Forget")
	}
	// The door is open again: the next delivery is processed.
	if processed, err := b.store.Process(ctx, "order-1", charge("order-1")); err != nil || !processed {
		t.Errorf("Process after Forget: %v, %v; want processed", processed, err)
	}
	if n := chargesPerOrder(t, b.pool)["order-1"]; n != 2 {
		t.Errorf("order-1 charged %d times, want 2 (once before Forget, once after)", n)
	}
	if ok, err := b.store.Forget(ctx, "order-2"); err != nil || ok {
		t.Errorf("Forget of an unknown ID: %v, %v", ok, err)
	}
	if recorded(t, b.pool, "billing", "order-2") {
		t.Error("Forget of an unknown ID left a row behind")
	}
	if _, err := b.store.Forget(ctx, "a\x00b"); !errors.Is(err, pgdedup.ErrInvalidMessageID) {
		t.Errorf("Forget of an ID with a NUL: %v", err)
	}
}

// A first delivery in flight: Forget neither deletes nothing and returns
// (which would let a redelivery run beside it) nor deletes its row early.
func TestForgetInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	bounded, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "billing", LockTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pool, app := namedPool(t, b)
	forgetter, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("LockTimeout", func(t *testing.T) {
		holder := pgtest.HoldClaim(t, b.pool, b.store, "held")
		if ok, err := bounded.Forget(ctx, "held"); !errors.Is(err, pgdedup.ErrInFlight) || ok {
			t.Errorf("Forget of an ID in flight, with LockTimeout: %v, %v; want ErrInFlight", ok, err)
		}
		if err := holder.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if !recorded(t, b.pool, "billing", "held") {
			t.Error("the in-flight delivery's row is gone after Forget gave up")
		}
	})

	for _, commit := range []bool{true, false} {
		name := map[bool]string{true: "waits for a commit", false: "waits for a rollback"}[commit]
		t.Run(name, func(t *testing.T) {
			id := "waited-" + name
			holder := pgtest.HoldClaim(t, b.pool, b.store, id)
			type result struct {
				ok  bool
				err error
			}
			done := make(chan result, 1)
			go func() {
				ok, err := forgetter.Forget(ctx, id)
				done <- result{ok, err}
			}()
			waitForLockWait(t, b, app)
			var err error
			if commit {
				err = holder.Commit(ctx)
			} else {
				err = holder.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil || r.ok != commit {
				t.Errorf("Forget: %v, %v; want %v, nil", r.ok, r.err, commit)
			}
			if recorded(t, b.pool, "billing", id) {
				t.Errorf("%s recorded after Forget", id)
			}
		})
	}
}

// namedPool returns a pool on b's schema whose sessions carry an
// application_name of their own, and that name, so that a test can see their
// lock waits and no other test's (waitForLockWait).
func namedPool(t *testing.T, b *bundle) (*pgxpool.Pool, string) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	app := "waiter_" + b.db.Schema
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, app
}

// waitForLockWait returns once a session named app waits for a lock (on
// Citus: a worker's backend of such a coordinator session), and fails t after
// 30s.
func waitForLockWait(t *testing.T, b *bundle, app string) {
	t.Helper()
	sql := `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`
	if pgtest.CitusColumn() != "" {
		sql = `SELECT count(*) FROM citus_stat_activity c JOIN citus_stat_activity w USING (global_pid)
WHERE c.application_name = $1 AND w.wait_event_type = 'Lock'`
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var n int
		if err := b.pool.QueryRow(context.Background(), sql, app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
	}
	t.Fatal("no session waited for a lock within 30s")
}
