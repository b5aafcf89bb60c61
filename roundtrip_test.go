package pgdedup_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup"
)

// The ambiguous commit (the connection cut around COMMIT) is tested, with
// Process and ProcessBatch under load, in internal/testing/faults (TestAmbiguousCommit).

// Round trips, counted on the wire after the statements are prepared: a new
// message costs what the bare transaction costs (BEGIN+claim, fn's insert,
// COMMIT = 3), a duplicate 2, Claim and ClaimBatch one each.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	store, pool, measure := countedStore(t, b)
	ctx := ctxT(t)
	n := 0
	process := func() error { n++; _, err := store.Process(ctx, fmt.Sprint("m", n), charge("o")); return err }
	bare := func() error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		if err := charge("o")(ctx, tx); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	duplicate := func() error { _, err := store.Process(ctx, "m1", charge("o")); return err }
	for range 2 { // warm up: prepare statements on the single connection
		_ = process()
		_ = bare()
		_ = duplicate()
	}
	if got, want := measure(process), measure(bare); got != want || got != 3 {
		t.Errorf("Process of a new message: %d round trips, bare transaction: %d; want both 3", got, want)
	}
	if got := measure(duplicate); got != 2 {
		t.Errorf("Process of a duplicate: %d round trips, want 2", got)
	}
	// LockTimeout adds statements to the pipeline, not round trips.
	bounded, err := pgdedup.New(pool, pgdedup.Config{Consumer: "bounded", LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	processBounded := func() error { n++; _, err := bounded.Process(ctx, fmt.Sprint("m", n), charge("o")); return err }
	_, _ = processBounded(), processBounded()
	if got := measure(processBounded); got != 3 {
		t.Errorf("Process with LockTimeout: %d round trips, want 3", got)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	warm := make([]string, 1000) // a batch of the measured size: Citus claims it as VALUES of 1024 rows
	for i := range warm {
		warm[i] = fmt.Sprint("warm", i)
	}
	for range 2 {
		_, _ = store.Claim(ctx, tx, "warm")
		_, _ = store.ClaimBatch(ctx, tx, warm)
	}
	if got := measure(func() error { _, err := store.Claim(ctx, tx, "c1"); return err }); got != 1 {
		t.Errorf("Claim: %d round trips, want 1", got)
	}
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprint("b", i)
	}
	if got := measure(func() error { _, err := store.ClaimBatch(ctx, tx, ids); return err }); got != 1 {
		t.Errorf("ClaimBatch of 1000: %d round trips, want 1", got)
	}
}
