package pgdedup_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// hostileIDs are IDs Postgres text cannot hold or that are too long, with what
// the error must say.
var hostileIDs = []struct{ name, id, says string }{
	{"empty", "", "empty"},
	{"NUL", "order\x00-1", "NUL"},
	{"NUL only", "\x00", "NUL"},
	{"invalid byte", "order-\xff", "UTF-8"},
	{"truncated rune", "caf\xc3", "UTF-8"},
	{"surrogate half", "\xed\xa0\x80", "UTF-8"},
	{"1025 bytes", strings.Repeat("a", 1025), "1025 bytes"},
	{"1026 bytes of euros", strings.Repeat("€", 342), "1026 bytes"},
	{"1 MB", strings.Repeat("x", 1<<20), "1048576 bytes"},
}

// Hostile IDs get ErrInvalidMessageID saying why, before any round trip: a Store
// on a closed pool reports them the same way, fn never runs, and a caller's
// transaction is not aborted by Claim or ClaimBatch.
func TestHostileIDsAreRejectedBeforeTheDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	closedPool, err := pgxpool.New(ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	closedPool.Close()
	offline, err := pgdedup.New(closedPool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck

	for _, c := range hostileIDs {
		check := func(call string, err error, says string) {
			t.Helper()
			if !errors.Is(err, pgdedup.ErrInvalidMessageID) || !strings.Contains(err.Error(), says) {
				t.Errorf("%s, %s: err=%.200v, want ErrInvalidMessageID saying %q", c.name, call, err, says)
			}
		}
		fnRan := false
		fn := func(context.Context, pgx.Tx) error { fnRan = true; return nil }
		batchFn := func(context.Context, pgx.Tx, []string) error { fnRan = true; return nil }
		batch := []string{"good-0", "good-1", c.id}

		check("ValidateMessageID", pgdedup.ValidateMessageID(c.id), c.says)
		for _, s := range []*pgdedup.Store{b.store, offline} {
			_, err := s.Process(ctx, c.id, fn)
			check("Process", err, c.says)
			_, err = s.ProcessBatch(ctx, batch, batchFn)
			check("ProcessBatch", err, "message 2 of 3")
		}
		_, err := b.store.Claim(ctx, tx, c.id)
		check("Claim", err, c.says)
		_, err = b.store.ClaimBatch(ctx, tx, batch)
		check("ClaimBatch", err, "message 2 of 3")
		if fnRan {
			t.Errorf("%s: fn ran", c.name)
		}
	}
	// The transaction is still usable: nothing reached the server.
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM processed_messages`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("caller's transaction after hostile claims: count=%d err=%v, want 0, nil", n, err)
	}
}

// IDs at the limits of what is valid are stored and compared byte for byte:
// no trimming, case folding, Unicode normalization or LIKE-style matching.
func TestOddValidIDsRoundTripExactly(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	ids := []string{
		strings.Repeat("a", pgdedup.MaxMessageIDLen),
		strings.Repeat("€", 341) + "a", // 1024 bytes
		"é", "e\u0301", "A", "a", "a ", " a", "\t\n\r", "\x7f", "\u00a0",
		"%", "_", "a%", `\`, `'`, `"`, "🦫", "\uFEFFa", "\U0010FFFF",
	}
	for round, want := range []bool{true, false} {
		for _, id := range ids {
			processed, err := b.store.Process(ctx, id, charge(id))
			if err != nil || processed != want {
				t.Fatalf("round %d, ID %q: processed=%v err=%v, want %v, nil", round+1, id, processed, err, want)
			}
		}
	}
	rows, err := b.pool.Query(ctx, `SELECT message_id FROM processed_messages WHERE consumer = 'billing'`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(ids))
	if !slices.Equal(got, want) {
		t.Fatalf("recorded IDs differ from the IDs sent:\n got %q\nwant %q", got, want)
	}
	for id, n := range chargesPerOrder(t, b.pool) {
		if n != 1 {
			t.Errorf("order %q charged %d times, want 1", id, n)
		}
	}
}

// One bad ID among 100,000 rejects the whole batch, naming its index, and
// records nothing: never a half-written batch.
func TestBatchWithOneBadIDRecordsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	ids := batchIDs(0, 100_000)
	ids[73_456] = "msg-\x00"
	const says = "message 73456 of 100000"

	_, err := b.store.ProcessBatch(ctx, ids, func(context.Context, pgx.Tx, []string) error {
		t.Error("fn ran for a batch with a bad ID")
		return nil
	})
	if !errors.Is(err, pgdedup.ErrInvalidMessageID) || !strings.Contains(err.Error(), says) {
		t.Fatalf("ProcessBatch: err=%v, want ErrInvalidMessageID saying %q", err, says)
	}
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := b.store.ClaimBatch(ctx, tx, ids); !errors.Is(err, pgdedup.ErrInvalidMessageID) || !strings.Contains(err.Error(), says) {
			t.Errorf("ClaimBatch: err=%v, want ErrInvalidMessageID saying %q", err, says)
		}
		return nil // commit whatever the failed ClaimBatch left: it must be nothing
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatalf("%d IDs recorded from rejected batches, want 0", n)
	}
}

// A 100,000-ID batch is one statement; a second, overlapping one gets exactly
// its new IDs, in input order, each once although repeated.
func TestHundredThousandIDBatches(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	chargeAll := func(ctx context.Context, tx pgx.Tx, fresh []string) error {
		_, err := tx.Exec(ctx, `INSERT INTO charges (order_id) SELECT unnest($1::text[])`, fresh)
		return err
	}
	first := batchIDs(0, 100_000)
	start := time.Now()
	fresh, err := b.store.ProcessBatch(ctx, first, chargeAll)
	if err != nil || !slices.Equal(fresh, first) {
		t.Fatalf("first batch: %d fresh, err=%v, want all 100000 in order", len(fresh), err)
	}
	t.Logf("100,000 new IDs: %v", time.Since(start))

	second := append(batchIDs(50_000, 100_000), batchIDs(140_000, 10_000)...) // half old, 10,000 repeated
	rand.Shuffle(len(second), func(i, j int) { second[i], second[j] = second[j], second[i] })
	want := slices.DeleteFunc(slices.Clone(second), func(id string) bool { return id < "msg-0100000" })
	want = uniqueInOrder(want)
	start = time.Now()
	fresh, err = b.store.ProcessBatch(ctx, second, chargeAll)
	if err != nil || !slices.Equal(fresh, want) {
		t.Fatalf("second batch: %d fresh, err=%v, want the %d new IDs in input order", len(fresh), err, len(want))
	}
	t.Logf("110,000 IDs, 50,000 new: %v", time.Since(start))
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 150_000 {
		t.Fatalf("%d IDs recorded, want 150000", n)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM (SELECT order_id FROM charges GROUP BY order_id HAVING count(*) = 1) c`); n != 150_000 {
		t.Fatalf("%d orders charged exactly once, want 150000", n)
	}
}
