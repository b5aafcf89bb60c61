package pgdedup_test

import (
	"bytes"
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

// Consumer names and message IDs are bound parameters: SQL in them is stored
// byte for byte, harms nothing, and matches no other consumer's rows.
func TestConsumerAndIDsAreNotSQL(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	if _, err := b.store.Process(ctx, "m1", charge("o-billing")); err != nil {
		t.Fatal(err)
	}
	hostile := []string{
		`x'); DROP TABLE charges; --`,
		`billing' OR '1'='1`,
		`billing'--`,
		`"; DROP SCHEMA public CASCADE; --`,
		`$1`,
		`\'; DELETE FROM processed_messages; --`,
		`E'\x27'`,
		"billing\u2019 OR 1=1",
	}
	for _, consumer := range hostile {
		store, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: consumer})
		if err != nil {
			t.Fatalf("New with Consumer %q: %v", consumer, err)
		}
		for _, id := range append([]string{"m1"}, hostile...) {
			processed, err := store.Process(ctx, id, charge("o-hostile"))
			if err != nil || !processed {
				t.Fatalf("consumer %q, ID %q: processed=%v err=%v, want true, nil", consumer, id, processed, err)
			}
			if !recorded(t, b.pool, consumer, id) {
				t.Fatalf("consumer %q, ID %q not recorded verbatim", consumer, id)
			}
		}
	}
	want := len(hostile) * (len(hostile) + 1)
	if got := chargesPerOrder(t, b.pool); got["o-hostile"] != want || got["o-billing"] != 1 {
		t.Fatalf("charges per order %v, want o-hostile %d times and o-billing once", got, want)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != want+1 {
		t.Fatalf("%d IDs recorded, want %d", n, want+1)
	}
	if _, err := b.store.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != want+1 {
		t.Fatalf("Cleanup left %d IDs of unexpired %d", n, want+1)
	}
}

// FuzzClaimBatch claims a random batch in a transaction against real Postgres,
// after claiming its first k IDs, and checks the outcome against a model: a
// batch with a bad ID fails whole, naming the first bad index, and records
// nothing; otherwise the fresh IDs are the batch's IDs not claimed before, each
// once, in input order, and what Postgres holds equals the IDs byte for byte.
// The batch is data split at sep. Each input rolls back, so inputs are
// independent. Run longer with:
// go test -run '^$' -fuzz '^FuzzClaimBatch$' -fuzztime 1m .
func FuzzClaimBatch(f *testing.F) {
	f.Add([]byte("a,b,c"), byte(','), uint8(0))
	f.Add([]byte("a,b,a,c,b"), byte(','), uint8(2))
	f.Add([]byte("x|y|x"), byte('|'), uint8(3))
	f.Add([]byte("ok,,ok"), byte(','), uint8(1))
	f.Add([]byte("ok;bad\x00;ok"), byte(';'), uint8(1))
	f.Add([]byte("ok;\xff;ok"), byte(';'), uint8(0))
	f.Add([]byte("é;e\u0301;E; é;é "), byte(';'), uint8(1))
	f.Add(append([]byte("short\n"), bytes.Repeat([]byte("L"), 1025)...), byte('\n'), uint8(1))
	f.Add(bytes.Repeat([]byte("id\x00"), 500), byte(0), uint8(7))

	db := pgtest.New(f)
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, sep byte, k uint8) {
		ids := strings.Split(string(data), string([]byte{sep}))
		pre := ids[:min(int(k), len(ids))]
		ctx := context.Background()
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // the model's checks run inside tx

		claimed := checkClaimBatch(t, store, tx, pre, nil)
		checkClaimBatch(t, store, tx, ids, claimed)
	})
}

// checkClaimBatch runs ClaimBatch(ids) in tx, whose claims so far are claimed,
// checks it against the model and returns the claims after it.
func checkClaimBatch(t *testing.T, store *pgdedup.Store, tx pgx.Tx, ids, claimed []string) []string {
	t.Helper()
	ctx := context.Background()
	fresh, err := store.ClaimBatch(ctx, tx, ids)

	bad := slices.IndexFunc(ids, func(id string) bool { return !validID(id) })
	var want []string
	if bad < 0 {
		seen := make(map[string]bool, len(claimed)+len(ids))
		for _, id := range claimed {
			seen[id] = true
		}
		for _, id := range ids {
			if !seen[id] {
				want = append(want, id)
			}
			seen[id] = true
		}
	} else {
		says := fmt.Sprintf("message %d of %d", bad, len(ids))
		if !errors.Is(err, pgdedup.ErrInvalidMessageID) || !strings.Contains(err.Error(), says) {
			t.Fatalf("ClaimBatch(%q) err=%v, want ErrInvalidMessageID saying %q", ids, err, says)
		}
	}
	if bad < 0 && err != nil {
		t.Fatalf("ClaimBatch(%q): %v", ids, err)
	}
	if !slices.Equal(fresh, want) {
		t.Fatalf("ClaimBatch(%q) after %q: fresh=%q, want %q", ids, claimed, fresh, want)
	}
	claimed = append(claimed, want...)

	rows, err := tx.Query(ctx, `SELECT message_id FROM processed_messages WHERE consumer = 'fuzz'`)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(stored)
	if want := slices.Sorted(slices.Values(claimed)); !slices.Equal(stored, want) {
		t.Fatalf("after ClaimBatch(%q): Postgres holds %q, want %q", ids, stored, want)
	}
	return claimed
}
