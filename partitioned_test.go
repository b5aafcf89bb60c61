package pgdedup_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// setupPartitioned is setup with the table made Partitioned by Store.Setup:
// Retention ÷ Partitions is the span (cfg's, or 1 s).
func setupPartitioned(t *testing.T, cfg pgdedup.Config) *bundle {
	t.Helper()
	cfg.Layout = pgdedup.Partitioned
	if cfg.Retention == 0 {
		cfg.Retention, cfg.Partitions = 10*time.Second, 10
	}
	b := setup(t, cfg)
	if err := b.store.Setup(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	return b
}

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
