package pgdedup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

var (
	_ pgdedup.DB = (*pgxpool.Pool)(nil)
	_ pgdedup.DB = (*pgx.Conn)(nil)
)

// A single *pgx.Conn works as the Store's DB too (used from one goroutine).
func TestProcessOnConn(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	conn, err := pgx.Connect(ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	store, err := pgdedup.New(conn, pgdedup.Config{Consumer: "billing", LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		if ok, err := store.Process(ctx, "m", charge("o")); ok != want || err != nil {
			t.Fatalf("Process #%d = %v, %v; want %v", i+1, ok, err, want)
		}
	}
	errBoom := errors.New("boom")
	if _, err := store.Process(ctx, "n", func(context.Context, pgx.Tx) error { return errBoom }); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	if conn.PgConn().TxStatus() != 'I' {
		t.Fatalf("connection left in transaction status %q", conn.PgConn().TxStatus())
	}
	if got := chargesPerOrder(t, b.pool); got["o"] != 1 || len(got) != 1 {
		t.Fatalf("charges %v", got)
	}
}
