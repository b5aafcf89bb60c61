package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdedup/pgdedup"
)

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
			if _, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend($1::int)`, pid); err != nil {
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

// IsTransient classifies by SQLSTATE and error type alone, wrapped or not.
func TestIsTransient(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "any text"} }
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"serialization failure 40001", pg("40001"), true},
		{"deadlock 40P01", pg("40P01"), true},
		{"admin shutdown 57P01", pg("57P01"), true},
		{"crash shutdown 57P02", pg("57P02"), true},
		{"cannot connect now 57P03", pg("57P03"), true},
		{"connection failure 08006", pg("08006"), true},
		{"connection exception 08000", pg("08000"), true},
		{"wrapped 40001", fmt.Errorf("charge: %w", pg("40001")), true},
		{"unique violation 23505", pg("23505"), false},
		{"lock not available 55P03", pg("55P03"), false},
		{"undefined table 42P01", pg("42P01"), false},
		{"query canceled 57014", pg("57014"), false},
		{"plain error", errors.New("serialization failure"), false},
		{"context canceled", context.Canceled, false},
		{"deadline exceeded", fmt.Errorf("claim: %w", context.DeadlineExceeded), false},
		{"io.EOF", io.EOF, true},
		{"unexpected EOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{"connection reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{"broken pipe", fmt.Errorf("write: %w", syscall.EPIPE), true},
		{"connection refused", syscall.ECONNREFUSED, true},
		{"invalid message ID", pgdedup.ErrInvalidMessageID, false},
		{"in flight", pgdedup.ErrInFlight, false},
	} {
		if got := pgdedup.IsTransient(c.err); got != c.want {
			t.Errorf("IsTransient(%s) = %v, want %v", c.name, got, c.want)
		}
	}
}
