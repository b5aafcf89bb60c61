package pgdedup_test

import (
	"testing"
	"time"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// sealedPartitions counts the partitions of processed_messages that end at
// or before sealed.
func sealedPartitions(t *testing.T, b *bundle) int {
	t.Helper()
	return pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)') AS e(m)
WHERE i.inhparent = 'processed_messages'::regclass
AND e.m[1]::timestamptz <= (SELECT sealed FROM pgdedup_partitions WHERE parent = 'processed_messages'::regclass)`)
}

// A claim with WithRetention(1h) among short-lived ones, and a raw row with
// an absurd expires_at, hold back no partition: the partitions after theirs
// go once their rows expired, and theirs too (their rows carried to the
// newest sealed partition). Both IDs stay duplicates; the short-lived ones
// are forgotten.
func TestPartitionedLongLivedRows(t *testing.T) {
	t.Parallel()
	b := setupPartitioned(t, pgdedup.Config{}) // 2-second partitions
	keepPartitions(t, b)
	ctx := ctxT(t)
	cleaner, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "cleaner", Retention: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if processed, err := b.store.Process(ctx, "long", charge("long"), pgdedup.WithRetention(time.Hour)); err != nil || !processed {
		t.Fatalf("long: %v, %v", processed, err)
	}
	mustExec(t, b.pool, `INSERT INTO processed_messages (consumer, message_id, expires_at) VALUES ('billing', 'absurd', '9999-01-01')`)
	for i := range 3 {
		waitSwitch(t, b.pool)
		if processed, err := b.store.Process(ctx, pgtest.SeedID("short-", i), charge("short")); err != nil || !processed {
			t.Fatalf("short %d: %v, %v", i, processed, err)
		}
	}
	mustExec(t, b.pool, `UPDATE processed_messages SET expires_at = now() - interval '1 second' WHERE message_id LIKE 'short-%'`)
	waitSwitch(t, b.pool)
	// Only the newest sealed partition is left before the current one (a
	// Retention of the cleaner's, a second, has not passed since its end).
	// On Citus, where nothing is carried, the long-lived rows' own partition
	// stays, and a detach (not CONCURRENTLY) may give up under load and wait
	// for the next run: there, the partition of short-1's claim, after the
	// long-lived rows' own, goes.
	var oneAt time.Time
	if err := b.pool.QueryRow(ctx, `SELECT max(processed_at) FROM processed_messages WHERE message_id = $1`, pgtest.SeedID("short-", 1)).Scan(&oneAt); err != nil {
		t.Fatal(err)
	}
	oneGone := func() bool {
		return pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'processed_messages'::regclass
AND $1 >= (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)'))[1]::timestamptz
AND $1 < (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz`, oneAt) == 0
	}
	cleanupUntil(ctx, t, b, cleaner, "the partitions after the long-lived rows' dropped", func() bool {
		if pgtest.CitusColumn() != "" {
			return oneGone()
		}
		return sealedPartitions(t, b) <= 1
	})
	for _, id := range []string{"long", "absurd"} {
		if processed, err := b.store.Process(ctx, id, charge(id)); err != nil || processed {
			t.Errorf("%s after the cleanup: processed=%v err=%v, want a duplicate", id, processed, err)
		}
	}
	// (On Citus short-0 may have a hand-over copy in the kept partition.)
	if processed, err := b.store.Process(ctx, pgtest.SeedID("short-", 0), charge("short")); pgtest.CitusColumn() == "" && (err != nil || !processed) {
		t.Errorf("an expired short-lived ID: processed=%v err=%v, want processed (forgotten with its partition)", processed, err)
	}
	if n := chargesPerOrder(t, b.pool)["long"]; n != 1 {
		t.Errorf("long charged %d times, want 1", n)
	}
}
