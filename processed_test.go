package pgdedup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdedup/pgdedup"
)

func TestProcessNewThenDuplicate(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	b := setup(t, pgdedup.Config{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	ctx := ctxT(t)

	processed, err := b.store.Process(ctx, "msg-1", charge("order-1"))
	if err != nil || !processed {
		t.Fatalf("first delivery: processed=%v err=%v, want true, nil", processed, err)
	}
	calls := 0
	processed, err = b.store.Process(ctx, "msg-1", func(ctx context.Context, tx pgx.Tx) error {
		calls++
		return charge("order-1")(ctx, tx)
	})
	if err != nil || processed || calls != 0 {
		t.Fatalf("duplicate: processed=%v err=%v fn calls=%d, want false, nil, 0", processed, err, calls)
	}
	if got := chargesPerOrder(t, b.pool); got["order-1"] != 1 {
		t.Fatalf("order-1 charged %d times, want 1", got["order-1"])
	}
	if !recorded(t, b.pool, "billing", "msg-1") {
		t.Fatal("msg-1 not recorded")
	}
	if !strings.Contains(logs.String(), "skipped duplicate") || !strings.Contains(logs.String(), "msg-1") {
		t.Fatalf("duplicate not logged; log:\n%s", logs.String())
	}
	if n := acquiredConns(b.pool); n != 0 {
		t.Fatalf("%d connections still acquired", n)
	}
}

func TestProcessRecordsExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{Retention: 90 * time.Minute})
	ctx := ctxT(t)
	if _, err := b.store.Process(ctx, "m", charge("o")); err != nil {
		t.Fatal(err)
	}
	var secs float64
	err := b.pool.QueryRow(ctx, `SELECT extract(epoch FROM expires_at - processed_at) FROM processed_messages WHERE message_id = 'm'`).Scan(&secs)
	if err != nil {
		t.Fatal(err)
	}
	if secs != 90*60 {
		t.Fatalf("expires_at - processed_at = %vs, want 5400s (Retention)", secs)
	}
}

func TestConsumersAreIndependent(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{Consumer: "billing"})
	ctx := ctxT(t)
	emails, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "emails"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*pgdedup.Store{b.store, emails, b.store, emails} {
		if _, err := s.Process(ctx, "msg-1", charge("order-"+s.Consumer())); err != nil {
			t.Fatal(err)
		}
	}
	got := chargesPerOrder(t, b.pool)
	if got["order-billing"] != 1 || got["order-emails"] != 1 {
		t.Fatalf("charges %v, want one per consumer", got)
	}
}

func TestProcessFnErrorRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	errDeclined := errors.New("card declined")
	processed, err := b.store.Process(ctx, "msg-1", func(ctx context.Context, tx pgx.Tx) error {
		if err := charge("order-1")(ctx, tx); err != nil {
			return err
		}
		return fmt.Errorf("charging: %w", errDeclined)
	})
	if !errors.Is(err, errDeclined) || processed {
		t.Fatalf("processed=%v err=%v, want false and the fn's error", processed, err)
	}
	if recorded(t, b.pool, "billing", "msg-1") || len(chargesPerOrder(t, b.pool)) != 0 {
		t.Fatal("a failed fn left the ID or the charge behind")
	}
	// The redelivery is processed.
	processed, err = b.store.Process(ctx, "msg-1", charge("order-1"))
	if err != nil || !processed {
		t.Fatalf("redelivery: processed=%v err=%v", processed, err)
	}
	if got := chargesPerOrder(t, b.pool)["order-1"]; got != 1 {
		t.Fatalf("order-1 charged %d times, want 1", got)
	}
}

func TestProcessFnPanicRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the fn's panic", r)
			}
		}()
		_, _ = b.store.Process(ctx, "msg-1", func(ctx context.Context, tx pgx.Tx) error {
			if err := charge("order-1")(ctx, tx); err != nil {
				return err
			}
			panic("boom")
		})
	}()
	if recorded(t, b.pool, "billing", "msg-1") || len(chargesPerOrder(t, b.pool)) != 0 {
		t.Fatal("a panicking fn left the ID or the charge behind")
	}
	if n := acquiredConns(b.pool); n != 0 {
		t.Fatalf("panic leaked %d connections", n)
	}
}

// Many consumers receive the same few hundred messages in random order; each
// order must be charged exactly once and each processed=true counted once.
func TestProcessConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	const ids, workers, rounds = 200, 16, 2
	var processed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			order := rand.Perm(ids * rounds)
			for _, i := range order {
				id := fmt.Sprintf("msg-%d", i%ids)
				ok, err := b.store.Process(ctx, id, charge(id))
				if err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
				if ok {
					processed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
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

// holdClaim claims id in a transaction of its own and leaves it open.
func holdClaim(t *testing.T, b *bundle, id string) pgx.Tx {
	t.Helper()
	ctx := ctxT(t)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if ok, err := b.store.Claim(ctx, tx, id); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	if err := charge(id)(ctx, tx); err != nil {
		t.Fatal(err)
	}
	return tx
}

func TestDuplicateWaitsForInFlight(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("first commits=%v", commit), func(t *testing.T) {
			t.Parallel()
			b := setup(t, pgdedup.Config{})
			ctx := ctxT(t)
			first := holdClaim(t, b, "msg-1")

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
			inFlight.Add(1)
		}
	}})
	ctx := ctxT(t)
	first := holdClaim(t, b, "msg-1")

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
		t.Fatalf("%d in-flight events, want 1", inFlight.Load())
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

// raise makes fn fail with the given SQLSTATE on its first calls.
func raise(code string, failures int, calls *int) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		*calls++
		if err := charge("order-1")(ctx, tx); err != nil {
			return err
		}
		if *calls <= failures {
			_, err := tx.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '%s'; END $$`, code))
			return err
		}
		return nil
	}
}

func TestProcessRetriesTransientFailures(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"40001", "40P01"} {
		t.Run(code, func(t *testing.T) {
			t.Parallel()
			var retries atomic.Int64
			b := setup(t, pgdedup.Config{OnEvent: func(_ context.Context, e pgdedup.Event) {
				if e.Kind == pgdedup.EventRetry {
					retries.Add(1)
				}
			}})
			ctx := ctxT(t)
			calls := 0
			processed, err := b.store.Process(ctx, "msg-1", raise(code, 2, &calls))
			if err != nil || !processed || calls != 3 {
				t.Fatalf("processed=%v err=%v calls=%d, want true, nil, 3", processed, err, calls)
			}
			if got := chargesPerOrder(t, b.pool)["order-1"]; got != 1 {
				t.Fatalf("order-1 charged %d times, want 1", got)
			}
			if retries.Load() != 2 {
				t.Fatalf("%d retry events, want 2", retries.Load())
			}
		})
	}
}

func TestProcessGivesUpAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{MaxAttempts: 2})
	ctx := ctxT(t)
	calls := 0
	_, err := b.store.Process(ctx, "msg-1", raise("40001", 100, &calls))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" || calls != 2 {
		t.Fatalf("err=%v calls=%d, want the 40001 error after 2 attempts", err, calls)
	}
	if recorded(t, b.pool, "billing", "msg-1") || len(chargesPerOrder(t, b.pool)) != 0 {
		t.Fatal("failed attempts left data behind")
	}
}

func TestProcessDoesNotRetryPermanentErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	calls := 0
	_, err := b.store.Process(ctx, "msg-1", raise("23505", 100, &calls)) // unique_violation
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" || calls != 1 {
		t.Fatalf("err=%v calls=%d, want the 23505 error after 1 attempt", err, calls)
	}
}

// The backend serving fn is terminated mid-transaction: the attempt fails with
// a lost connection and the retry, on a new connection, processes the message.
func TestProcessRetriesLostConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	calls := 0
	processed, err := b.store.Process(ctx, "msg-1", func(ctx context.Context, tx pgx.Tx) error {
		calls++
		if err := charge("order-1")(ctx, tx); err != nil {
			return err
		}
		if calls == 1 {
			var pid int
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			if _, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT 1`)
			return err
		}
		return nil
	})
	if err != nil || !processed || calls != 2 {
		t.Fatalf("processed=%v err=%v calls=%d, want true, nil, 2", processed, err, calls)
	}
	if got := chargesPerOrder(t, b.pool)["order-1"]; got != 1 {
		t.Fatalf("order-1 charged %d times, want 1", got)
	}
}

// Under repeatable read a concurrent duplicate surfaces as a serialization
// failure instead of a wait; the retry sees the committed row and skips.
func TestProcessConcurrentDuplicatesRepeatableRead(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, MaxAttempts: 20})
	ctx := ctxT(t)
	const ids, workers = 50, 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, i := range rand.Perm(ids) {
				id := fmt.Sprint("msg-", i)
				if _, err := b.store.Process(ctx, id, charge(id)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := chargesPerOrder(t, b.pool)
	for i := range ids {
		if id := fmt.Sprint("msg-", i); got[id] != 1 {
			t.Fatalf("%s charged %d times, want 1", id, got[id])
		}
	}
}

// Retries stop when ctx is done, even with attempts left.
func TestProcessRetriesRespectContext(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{MaxAttempts: 1000})
	ctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	defer cancel()
	calls := 0
	start := time.Now()
	_, err := b.store.Process(ctx, "msg-1", raise("40001", 1_000_000, &calls))
	if err == nil || time.Since(start) > 10*time.Second || calls >= 1000 {
		t.Fatalf("err=%v after %s and %d calls, want a prompt failure", err, time.Since(start), calls)
	}
	if n := acquiredConns(b.pool); n != 0 {
		t.Fatalf("%d connections still acquired", n)
	}
}
