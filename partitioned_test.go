package pgdedup_test

import (
	"cmp"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// setupPartitioned is setup with the table made Partitioned by Store.Setup:
// Retention ÷ Partitions is the span (cfg's, or 2 s). In the Citus pass the
// suite's processed_messages is distributed, and so is the partitioned one.
// Its cleanups keep the fewest partitions ahead (3) unless cfg says
// otherwise: creating partitions is slow on Citus, and the tests of the
// testSpan is s on one server, and at least 4 s on Citus. There each
// partition is distributed DDL, which takes over a second on a loaded
// 2-core machine (CI), so partitions of a second are created more slowly
// than the clock passes them, however often the cleaner runs.
func testSpan(s time.Duration) time.Duration {
	if pgtest.CitusColumn() != "" {
		return max(s, 4*time.Second)
	}
	return s
}

// runway set theirs.
func setupPartitioned(t *testing.T, cfg pgdedup.Config) *bundle {
	t.Helper()
	cfg.Layout = pgdedup.LayoutPartitioned
	if cfg.Retention == 0 {
		cfg.Retention, cfg.Partitions = 20*time.Second, 10
	}
	cfg.Runway = cmp.Or(cfg.Runway, fewestAhead)
	b := setup(t, cfg)
	if err := b.store.Setup(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	return b
}

// fewestAhead is a Config.Runway that keeps the fewest partitions ahead.
const fewestAhead = time.Millisecond

func TestPartitionedClaims(t *testing.T) {
	t.Parallel()
	b := setupPartitioned(t, pgdedup.Config{Retention: time.Hour}) // 5-minute partitions
	ctx := ctxT(t)
	for i, want := range []bool{true, false} {
		processed, err := b.store.Process(ctx, "m1", charge("o1"))
		if err != nil || processed != want {
			t.Fatalf("Process #%d: processed=%v err=%v, want %v", i+1, processed, err, want)
		}
	}
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if claimed, err := b.store.Claim(ctx, tx, "m2"); err != nil || !claimed {
			t.Errorf("Claim m2: claimed=%v err=%v, want true, nil", claimed, err)
		}
		fresh, err := b.store.ClaimBatch(ctx, tx, []string{"m1", "m3", "m2", "m4", "m3"})
		if err != nil || !slices.Equal(fresh, []string{"m3", "m4"}) {
			t.Errorf("ClaimBatch: fresh=%v err=%v, want [m3 m4]", fresh, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.store.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A switch to the next partition during the test adds hand-over copies.
	var inPartitions int64
	for _, p := range st.Partitions {
		inPartitions += p.Rows
	}
	if st.Rows < 4 || inPartitions != st.Rows || len(st.Partitions) < 4 || st.PartitionSpan != 5*time.Minute {
		t.Errorf("Stats: %d rows, partitions of %s: %+v; want 4 rows or more, in 4 partitions of 5m or more", st.Rows, st.PartitionSpan, st.Partitions)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(DISTINCT message_id) FROM processed_messages`); n != 4 {
		t.Errorf("%d IDs recorded, want 4", n)
	}
}

// TestRoundTrips on the partitioned layout: the hand-over protocol is one
// statement, so a claim costs what it costs on the plain table.
func TestPartitionedRoundTrips(t *testing.T) {
	t.Parallel()
	b := setupPartitioned(t, pgdedup.Config{Retention: time.Hour})
	store, pool, measure := countedStore(t, b)
	ctx := ctxT(t)
	n := 0
	process := func() error { n++; _, err := store.Process(ctx, fmt.Sprint("m", n), charge("o")); return err }
	duplicate := func() error { _, err := store.Process(ctx, "m1", charge("o")); return err }
	for range 2 {
		_, _ = process(), duplicate()
	}
	if got := measure(process); got != 3 {
		t.Errorf("Process of a new message: %d round trips, want 3", got)
	}
	if got := measure(duplicate); got != 2 {
		t.Errorf("Process of a duplicate: %d round trips, want 2", got)
	}
	timed := func() error {
		n++
		_, err := store.Process(ctx, fmt.Sprint("m", n), charge("o"), pgdedup.WithSentAt(time.Now()))
		return err
	}
	_ = timed() // its statement names its bounds: the first is prepared
	if got := measure(timed); got != 3 {
		t.Errorf("Process of a new message with a time: %d round trips, want 3", got)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for range 2 {
		_, _ = store.Claim(ctx, tx, "warm")
		_, _ = store.ClaimBatch(ctx, tx, batchIDs(0, 1000))
	}
	if got := measure(func() error { _, err := store.Claim(ctx, tx, "c1"); return err }); got != 1 {
		t.Errorf("Claim: %d round trips, want 1", got)
	}
	if got := measure(func() error { _, err := store.ClaimBatch(ctx, tx, batchIDs(1000, 1000)); return err }); got != 1 {
		t.Errorf("ClaimBatch of 1000: %d round trips, want 1", got)
	}
}

// ClaimSQL and ClaimBatchSQL on the partitioned layout, through database/sql.
func TestPartitionedClaimSQL(t *testing.T) {
	t.Parallel()
	b := setupPartitioned(t, pgdedup.Config{Retention: time.Hour})
	ctx := ctxT(t)
	db := stdlib.OpenDBFromPool(b.pool)
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for i, want := range []bool{true, false} {
		if claimed, err := b.store.ClaimSQL(ctx, tx, "s1"); err != nil || claimed != want {
			t.Fatalf("ClaimSQL #%d: claimed=%v err=%v, want %v", i+1, claimed, err, want)
		}
	}
	fresh, err := b.store.ClaimBatchSQL(ctx, tx, []string{"s1", "s2", "s3", "s2"})
	if err != nil || !slices.Equal(fresh, []string{"s2", "s3"}) {
		t.Fatalf("ClaimBatchSQL: fresh=%v err=%v, want [s2 s3]", fresh, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(DISTINCT message_id) FROM processed_messages`); n != 3 {
		t.Errorf("%d IDs recorded, want 3", n)
	}
}

// IDs imported by raw SQL with their original times (no key: the trigger
// fills it) land in the partition of their processed_at, the past one Setup
// made, and are duplicates; Cleanup drops that partition once they have all
// expired, and they are forgotten. A row older than every partition is
// refused.
func TestPartitionedImport(t *testing.T) {
	t.Parallel()
	b := setupPartitioned(t, pgdedup.Config{})
	keepPartitions(t, b)
	ctx := ctxT(t)
	// Times before sealed, which Setup set to the start of the partition
	// current when it began (on a loaded Citus cluster Setup can take
	// seconds), and within the partition it made for the past.
	mustExec(t, b.pool, `INSERT INTO processed_messages (consumer, message_id, processed_at, expires_at)
SELECT 'billing', 'imported-' || i, p.sealed - i * interval '4 seconds', now() + interval '1 minute'
FROM pgdedup_partitions p, generate_series(1, 2) i`)
	for _, id := range []string{"imported-1", "imported-2"} {
		if processed, err := b.store.Process(ctx, id, charge(id)); err != nil || processed {
			t.Fatalf("%s after the import: processed=%v err=%v, want a duplicate", id, processed, err)
		}
	}
	var inPast int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages
WHERE message_id LIKE 'imported-%' AND processed_at < (SELECT sealed FROM pgdedup_partitions)`).Scan(&inPast); err != nil || inPast != 2 {
		t.Fatalf("%d imported rows in sealed partitions (%v), want 2", inPast, err)
	}
	// Not before they expire: a cleaner whose Retention (a second) has
	// passed since their partition ended carries them forward while they
	// are live (partition_carry.go).
	cleaner, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "cleaner", Retention: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	waitSwitch(t, b.pool)
	if _, err := cleaner.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"imported-1", "imported-2"} {
		if processed, err := b.store.Process(ctx, id, charge(id)); err != nil || processed {
			t.Fatalf("%s after a Cleanup before it expired: processed=%v err=%v, want a duplicate", id, processed, err)
		}
	}
	// Once both expired (made so here), Cleanup drops their partition.
	expire(t, b, "billing")
	// (The test's keeper may be dropping it at the same time: Cleanup until
	// it is gone.)
	cleanupUntil(ctx, t, b, cleaner, "the imported IDs' partition dropped", func() bool {
		return pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE message_id LIKE 'imported-%'`) == 0
	})
	for _, id := range []string{"imported-1", "imported-2"} {
		if processed, err := b.store.Process(ctx, id, charge(id)); err != nil || !processed {
			t.Errorf("%s once expired and cleaned up: processed=%v err=%v, want processed", id, processed, err)
		}
	}
	_, err = b.pool.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, processed_at, expires_at)
VALUES ('billing', 'ancient', now() - interval '1 day', now())`)
	if err == nil {
		t.Error("a row older than every partition was imported")
	}
}
