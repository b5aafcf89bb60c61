package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

func TestClaimDuplicateKeepsTxUsable(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	if _, err := b.store.Process(ctx, "old", charge("old")); err != nil {
		t.Fatal(err)
	}
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for _, c := range []struct {
			id   string
			want bool
		}{{"new", true}, {"new", false}, {"old", false}} {
			claimed, err := b.store.Claim(ctx, tx, c.id)
			if err != nil {
				return err
			}
			if claimed != c.want {
				return fmt.Errorf("Claim(%q) = %v, want %v", c.id, claimed, c.want)
			}
		}
		return charge("new")(ctx, tx) // the transaction is not aborted
	})
	if err != nil {
		t.Fatal(err)
	}
	if !recorded(t, b.pool, "billing", "new") || chargesPerOrder(t, b.pool)["new"] != 1 {
		t.Fatal("the claim and the charge did not commit together")
	}
}

func TestClaimRollsBackWithTx(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := b.store.Claim(ctx, tx, "m"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if fresh, err := b.store.ClaimBatch(ctx, tx, []string{"a", "b"}); err != nil || len(fresh) != 2 {
		t.Fatal(fresh, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"m", "a", "b"} {
		if recorded(t, b.pool, "billing", id) {
			t.Fatalf("%s recorded although the transaction rolled back", id)
		}
	}
}

var errGaveUp = errors.New("gave up")

func TestClaimWithLockTimeoutRestoresSetting(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{LockTimeout: 50 * time.Millisecond})
	ctx := ctxT(t)
	first := pgtest.HoldClaim(t, b.pool, b.store, "busy")
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '7s'`); err != nil {
			return err
		}
		if _, err := b.store.Claim(ctx, tx, "free"); err != nil {
			return err
		}
		var lt string
		if err := tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&lt); err != nil {
			return err
		}
		if lt != "7s" {
			return fmt.Errorf("after Claim lock_timeout is %s, want the caller's 7s", lt)
		}
		_, err := b.store.Claim(ctx, tx, "busy")
		if !errors.Is(err, pgdedup.ErrInFlight) {
			return fmt.Errorf("Claim of an in-flight ID: %v, want ErrInFlight", err)
		}
		return errGaveUp // as documented, the transaction is aborted: roll back
	})
	if !errors.Is(err, errGaveUp) {
		t.Fatal(err)
	}
	_ = first.Rollback(ctx)
}

// A nil transaction is an error, as with ClaimSQL, not a panic.
func TestClaimNilTx(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	if _, err := b.store.Claim(ctx, nil, "m"); err == nil || !strings.Contains(err.Error(), "tx must not be nil") {
		t.Errorf("Claim with a nil tx: %v", err)
	}
	if _, err := b.store.ClaimBatch(ctx, nil, []string{"m"}); err == nil || !strings.Contains(err.Error(), "tx must not be nil") {
		t.Errorf("ClaimBatch with a nil tx: %v", err)
	}
}

func TestClaimBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	if _, err := b.store.Process(ctx, "c", charge("c")); err != nil {
		t.Fatal(err)
	}
	var fresh []string
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		fresh, err = b.store.ClaimBatch(ctx, tx, []string{"z", "c", "a", "z", "m", "a"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"z", "a", "m"}; !slices.Equal(fresh, want) {
		t.Fatalf("fresh = %q, want %q (new IDs, input order, each once)", fresh, want)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 4 {
		t.Fatalf("%d rows recorded, want 4", n)
	}
	if fresh, err := b.store.ClaimBatch(ctx, nilTx(t, b), nil); err != nil || fresh != nil {
		t.Fatalf("empty batch: %v %v", fresh, err)
	}
}

func nilTx(t *testing.T, b *bundle) pgx.Tx {
	tx, err := b.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// Overlapping batches in different orders, concurrently: sorted inserts mean
// no deadlock, and every ID is fresh for exactly one of them.
func TestClaimBatchOverlappingNoDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	const workers, batches, size, space = 8, 30, 50, 400
	var mu sync.Mutex
	freshCount := map[string]int{}
	pgtest.FanOut(t, workers, func(int) error {
		for range batches {
			ids := make([]string, size)
			for i := range ids {
				ids[i] = fmt.Sprint("m", rand.IntN(space))
			}
			fresh, err := b.store.ProcessBatch(ctx, ids, func(ctx context.Context, tx pgx.Tx, fresh []string) error {
				time.Sleep(time.Millisecond) // hold the row locks a little
				_, err := tx.Exec(ctx, `INSERT INTO charges (order_id) SELECT unnest($1::text[])`, fresh)
				return err
			})
			if err != nil {
				return err
			}
			mu.Lock()
			for _, id := range fresh {
				freshCount[id]++
			}
			mu.Unlock()
		}
		return nil
	})
	for id, n := range chargesPerOrder(t, b.pool) {
		if n != 1 || freshCount[id] != 1 {
			t.Fatalf("%s charged %d times, reported fresh %d times", id, n, freshCount[id])
		}
	}
}

func TestProcessBatchAllDuplicatesSkipsFn(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	insert := func(ctx context.Context, tx pgx.Tx, fresh []string) error {
		_, err := tx.Exec(ctx, `INSERT INTO charges (order_id) SELECT unnest($1::text[])`, fresh)
		return err
	}
	fresh, err := b.store.ProcessBatch(ctx, []string{"a", "b"}, insert)
	if err != nil || !slices.Equal(fresh, []string{"a", "b"}) {
		t.Fatal(fresh, err)
	}
	called := false
	fresh, err = b.store.ProcessBatch(ctx, []string{"b", "a", "b"}, func(context.Context, pgx.Tx, []string) error {
		called = true
		return nil
	})
	if err != nil || len(fresh) != 0 || called {
		t.Fatalf("all duplicates: fresh=%v err=%v fn called=%v", fresh, err, called)
	}
	errBoom := errors.New("boom")
	_, err = b.store.ProcessBatch(ctx, []string{"c", "a"}, func(context.Context, pgx.Tx, []string) error { return errBoom })
	if !errors.Is(err, errBoom) || recorded(t, b.pool, "billing", "c") {
		t.Fatalf("fn error: err=%v, c recorded=%v", err, recorded(t, b.pool, "billing", "c"))
	}
	if got := chargesPerOrder(t, b.pool); got["a"] != 1 || got["b"] != 1 || len(got) != 2 {
		t.Fatalf("charges %v", got)
	}
}
