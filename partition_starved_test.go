package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// cleanupHeldUp runs store's Cleanup while a transaction of the test holds
// sealing up: it may return ErrCleanupStarved (returned here), nothing else.
func cleanupHeldUp(t *testing.T, ctx context.Context, store *pgdedup.Store) error {
	t.Helper()
	_, err := store.Cleanup(ctx)
	if err != nil && !errors.Is(err, pgdedup.ErrCleanupStarved) {
		t.Fatal(err)
	}
	return err
}

// A session idle in transaction with a lock on the table holds sealing up.
// Within a span of sealing falling due Cleanup returns nil; once sealing has
// been due for a span, it returns ErrCleanupStarved naming the session, logs
// and reports it, and still creates the partitions ahead; claims go on. Once
// the session ends, the next run seals and returns nil.
func TestPartitionedSealStarved(t *testing.T) {
	t.Parallel()
	events := make(chan pgdedup.Event, 10)
	b := setupPartitioned(t, pgdedup.Config{OnEvent: func(_ context.Context, e pgdedup.Event) {
		if e.Kind == pgdedup.EventCleanup {
			events <- e
		}
	}}) // 2-second partitions
	ctx := ctxT(t)
	pgdedup.SetPartitionWaits(b.store, 10*time.Millisecond, 10*time.Millisecond)
	run := func() (current time.Time, err error) {
		t.Helper()
		before, _ := partitionClock(t, b.pool)
		_, err = b.store.Cleanup(ctx)
		if e := receive(t, events, "the cleanup event"); !errors.Is(e.Err, err) {
			t.Errorf("the event's Err is %v, want Cleanup's %v", e.Err, err)
		}
		after, _ := partitionClock(t, b.pool)
		if !after.Equal(before) {
			return time.Time{}, err // a switch during the run: no telling
		}
		return after, err
	}
	if _, err := run(); err != nil {
		t.Fatal(err)
	}

	idle := newSession(t, b)
	tx, err := idle.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	mustExec(t, tx, `SELECT FROM processed_messages LIMIT 0`)
	var pid int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	_, sealed := partitionClock(t, b.pool)

	// Sealing due (the switch), for less than a span: not starved yet.
	waitSwitch(t, b.pool)
	if current, err := run(); !current.IsZero() && current.Sub(sealed) < 2*2*time.Second && err != nil {
		t.Errorf("sealing due for less than a span: %v, want nil", err)
	}
	// Due for a span.
	waitSwitch(t, b.pool)
	if _, now := partitionClock(t, b.pool); !now.Equal(sealed) {
		t.Fatalf("sealed before %s while a session held the table since before %s", now, sealed)
	}
	_, err = b.store.Cleanup(ctx)
	if !errors.Is(err, pgdedup.ErrCleanupStarved) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d (role ", pid)) ||
		!strings.Contains(err.Error(), "idle in transaction") {
		t.Fatalf("Cleanup with sealing held up for a span: %v, want ErrCleanupStarved naming pid %d, idle in transaction", err, pid)
	}
	e := receive(t, events, "the starved cleanup's event")
	if !errors.Is(e.Err, pgdedup.ErrCleanupStarved) {
		t.Errorf("the event's Err is %v, want ErrCleanupStarved", e.Err)
	}
	// It created the partitions ahead all the same.
	current, _ := partitionClock(t, b.pool)
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)') AS b(m)
WHERE i.inhparent = 'processed_messages'::regclass AND b.m[1]::timestamptz = $1`, current.Add(3*2*time.Second)); n != 1 {
		t.Errorf("no partition 3 spans ahead of %s: %s", current, partitionsNow(t, b))
	}
	if processed, err := b.store.Process(ctx, "m1", charge("m1")); err != nil || !processed {
		t.Errorf("a claim while sealing is starved: processed=%v err=%v", processed, err)
	}

	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup once the session ended: %v", err)
	}
	receive(t, events, "the last cleanup's event")
	if current, sealed := partitionClock(t, b.pool); sealed.Before(current.Add(-2 * time.Second)) {
		t.Errorf("sealed before %s, want the partitions before %s sealed", sealed, current)
	}
}
