package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// Many consumers receive the same few hundred messages in random order; each
// order must be charged exactly once and each processed=true counted once.
func TestProcessConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	const ids, workers, rounds = 200, 16, 2
	var processed atomic.Int64
	pgtest.FanOut(t, workers, func(w int) error {
		for _, i := range rand.Perm(ids * rounds) {
			id := fmt.Sprintf("msg-%d", i%ids)
			ok, err := b.store.Process(ctx, id, charge(id))
			if err != nil {
				return fmt.Errorf("worker %d: %w", w, err)
			}
			if ok {
				processed.Add(1)
			}
		}
		return nil
	})
	got := chargesPerOrder(t, b.pool)
	if len(got) != ids {
		t.Fatalf("%d orders charged, want %d", len(got), ids)
	}
	for id, n := range got {
		if n != 1 {
			t.Fatalf("%s charged %d times", id, n)
		}
	}
	if processed.Load() != ids {
		t.Fatalf("Process reported %d new messages, want %d", processed.Load(), ids)
	}
}

func TestDuplicateWaitsForInFlight(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("first commits=%v", commit), func(t *testing.T) {
			t.Parallel()
			b := setup(t, pgdedup.Config{})
			ctx := ctxT(t)
			first := pgtest.HoldClaim(t, b.pool, b.store, "msg-1")
			if err := charge("msg-1")(ctx, first); err != nil {
				t.Fatal(err)
			}

			type result struct {
				processed bool
				err       error
			}
			done := make(chan result, 1)
			go func() {
				p, err := b.store.Process(ctx, "msg-1", charge("msg-1"))
				done <- result{p, err}
			}()
			select {
			case r := <-done:
				t.Fatalf("duplicate returned %+v while the first delivery was in flight", r)
			case <-time.After(300 * time.Millisecond):
			}
			var err error
			if commit {
				err = first.Commit(ctx)
			} else {
				err = first.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil || r.processed == commit {
				t.Fatalf("after the first delivery ended (commit=%v): processed=%v err=%v", commit, r.processed, r.err)
			}
			if got := chargesPerOrder(t, b.pool)["msg-1"]; got != 1 {
				t.Fatalf("msg-1 charged %d times, want 1", got)
			}
		})
	}
}

func TestLockTimeoutReturnsErrInFlight(t *testing.T) {
	t.Parallel()
	var inFlight atomic.Int64
	b := setup(t, pgdedup.Config{LockTimeout: 100 * time.Millisecond, OnEvent: func(_ context.Context, e pgdedup.Event) {
		if e.Kind == pgdedup.EventInFlight {
			inFlight.Add(e.Count)
		}
	}})
	ctx := ctxT(t)
	first := pgtest.HoldClaim(t, b.pool, b.store, "msg-1")
	if err := charge("msg-1")(ctx, first); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	calls := 0
	processed, err := b.store.Process(ctx, "msg-1", func(context.Context, pgx.Tx) error { calls++; return nil })
	if !errors.Is(err, pgdedup.ErrInFlight) || processed || calls != 0 {
		t.Fatalf("processed=%v err=%v calls=%d, want ErrInFlight and fn not called", processed, err, calls)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("gave up after %s, want about LockTimeout", waited)
	}
	if inFlight.Load() != 1 {
		t.Fatalf("%d messages reported in flight, want 1", inFlight.Load())
	}
	// A batch gives up whole, and reports each of its distinct IDs.
	fresh, err := b.store.ProcessBatch(ctx, []string{"x", "msg-1", "y", "x"}, func(context.Context, pgx.Tx, []string) error { calls++; return nil })
	if !errors.Is(err, pgdedup.ErrInFlight) || len(fresh) != 0 || calls != 0 {
		t.Fatalf("batch: fresh=%v err=%v calls=%d, want ErrInFlight and fn not called", fresh, err, calls)
	}
	if inFlight.Load() != 1+3 {
		t.Fatalf("%d messages reported in flight, want 1 and then the batch's 3", inFlight.Load())
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := chargesPerOrder(t, b.pool)["msg-1"]; got != 1 {
		t.Fatalf("msg-1 charged %d times, want 1", got)
	}
	// The lock timeout applies to the claim only: a new message's fn can wait
	// longer than LockTimeout for a lock of its own.
	mustExec(t, b.pool, `INSERT INTO charges (order_id) VALUES ('locked')`)
	blocker, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(ctx, `UPDATE charges SET consumer = 'x' WHERE order_id = 'locked'`); err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	time.AfterFunc(400*time.Millisecond, func() { _ = blocker.Rollback(ctx); close(released) })
	defer func() { <-released }()
	_, err = b.store.Process(ctx, "msg-2", func(ctx context.Context, tx pgx.Tx) error {
		var lt string
		if err := tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&lt); err != nil {
			return err
		}
		if lt != "0" {
			return fmt.Errorf("fn runs with lock_timeout %s, want the session's 0", lt)
		}
		_, err := tx.Exec(ctx, `UPDATE charges SET consumer = 'y' WHERE order_id = 'locked'`)
		return err
	})
	if err != nil {
		t.Fatalf("fn waiting on its own lock: %v", err)
	}
}

// Under repeatable read a concurrent duplicate surfaces as a serialization
// failure instead of a wait; the retry sees the committed row and skips.
func TestProcessConcurrentDuplicatesRepeatableRead(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, MaxAttempts: 20})
	ctx := ctxT(t)
	const ids, workers = 50, 8
	pgtest.FanOut(t, workers, func(int) error {
		for _, i := range rand.Perm(ids) {
			id := fmt.Sprint("msg-", i)
			if _, err := b.store.Process(ctx, id, charge(id)); err != nil {
				return err
			}
		}
		return nil
	})
	got := chargesPerOrder(t, b.pool)
	for i := range ids {
		if id := fmt.Sprint("msg-", i); got[id] != 1 {
			t.Fatalf("%s charged %d times, want 1", id, got[id])
		}
	}
}
