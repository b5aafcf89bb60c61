package idempotency_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// Stored responses on the partitioned layout (2-second partitions, a
// Retention of a minute, so that a loaded machine does not expire the key
// before the test's last request): a key's
// answer is replayed byte for byte after the next partition began, with the
// older partition unsealed (the claim's row and its hand-over copy) and once
// Cleanup sealed it (found by look-up); the handler ran once.
//
// Setup makes only a few partitions ahead (3 spans, 6-8 s here); a Cleanup
// makes the runway, as the cleaner a user runs beside it would. Without it,
// the first request got a 500 once on a loaded Citus cluster, most likely a
// claim that came after those seconds and found no partition (nothing was
// logged then; a failure now prints what the middleware logged).
func TestStoredResponsesOnPartitionedTable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	setupStore, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "setup", Layout: pgdedup.LayoutPartitioned,
		Retention: time.Minute, Partitions: 30})
	if err != nil {
		t.Fatal(err)
	}
	if err := setupStore.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := setupStore.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	b := setupOn(t, db, db.Pool, idempotency.Config{Store: pgdedup.Config{Retention: time.Minute,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}}, nil)
	first := post(t, b.url, "key-1", order)
	if first.status != 201 || first.replayed() {
		t.Fatalf("first request: %v\nthe middleware logged: %s", first, logs.String())
	}
	partition := func() (current time.Time) {
		if err := db.Pool.QueryRow(ctx, `SELECT date_bin(span, clock_timestamp(), '2000-01-01 00:00:00+00')
FROM pgdedup_partitions`).Scan(&current); err != nil {
			t.Fatal(err)
		}
		return current
	}
	for from := partition(); !partition().After(from); {
		time.Sleep(20 * time.Millisecond)
	}
	for i, cleanup := range []bool{false, true} {
		if cleanup {
			if _, err := b.mw.Store().Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
		}
		again := post(t, b.url, "key-1", order)
		if again.status != first.status || again.body != first.body || !again.replayed() {
			t.Fatalf("retry %d: %v\nfirst: %v\nthe middleware logged: %s", i+1, again, first, logs.String())
		}
	}
	if n := b.api.calls.Load(); n != 1 {
		t.Fatalf("handler called %d times, want 1", n)
	}
	if n := charges(t, b.pool); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}
