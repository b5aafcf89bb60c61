package pgdedup_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// invalidIDs are IDs Postgres text cannot hold, that are too long or blank
// (only whitespace, as a blank Consumer is refused), with what the error must
// say. The one table of invalid IDs: the tests and the fuzz
// seeds use it.
var invalidIDs = []struct{ name, id, says string }{
	{"empty", "", "empty"},
	{"NUL", "order\x00-1", "NUL"},
	{"NUL only", "\x00", "NUL"},
	{"invalid byte", "order-\xff", "UTF-8"},
	{"truncated rune", "caf\xc3", "UTF-8"},
	{"surrogate half", "\xed\xa0\x80", "UTF-8"},
	{"1025 bytes", strings.Repeat("a", pgdedup.MaxMessageIDLen+1), "1025 bytes"},
	{"1026 bytes of euros", strings.Repeat("€", 342), "1026 bytes"},
	{"1 MB", strings.Repeat("x", 1<<20), "1048576 bytes"},
	{"a space", " ", "blank"},
	{"spaces", "   ", "blank"},
	{"tab and newlines", "\t\n\r", "blank"},
	{"no-break space", "\u00a0", "blank"},
	{"ideographic space", "\u3000\u3000", "blank"},
}

// countingTracer counts the queries and batches a pool sends.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *countingTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// Invalid IDs get ErrInvalidMessageID saying why, short (the ID is not
// echoed), before anything is sent, by every call that takes an ID: the
// pool's tracer counts no query, fn never runs, a batch with one is rejected
// whole naming its index, and the caller's transaction (pgx or database/sql)
// is not aborted by a claim.
func TestInvalidIDsRejectedBeforeTheDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	tracer := &countingTracer{}
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	sqlTx, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlTx.Rollback() //nolint:errcheck
	sent := tracer.n.Load()

	for _, c := range invalidIDs {
		check := func(call string, err error, says string) {
			t.Helper()
			if !errors.Is(err, pgdedup.ErrInvalidMessageID) || !strings.Contains(err.Error(), says) {
				t.Errorf("%s, %s: err=%.200v, want ErrInvalidMessageID saying %q", c.name, call, err, says)
			} else if len(err.Error()) > 200 {
				t.Errorf("%s, %s: the error is %d bytes long; it must not echo the ID", c.name, call, len(err.Error()))
			}
		}
		fnRan := false
		fn := func(context.Context, pgx.Tx) error { fnRan = true; return nil }
		batchFn := func(context.Context, pgx.Tx, []string) error { fnRan = true; return nil }
		batch := []string{"good-0", "good-1", c.id, "good-3"}

		check("ValidateMessageID", pgdedup.ValidateMessageID(c.id), c.says)
		_, err := store.Process(ctx, c.id, fn)
		check("Process", err, c.says)
		_, err = store.ProcessBatch(ctx, batch, batchFn)
		check("ProcessBatch", err, "message 2 of 4")
		_, err = store.Claim(ctx, tx, c.id)
		check("Claim", err, c.says)
		_, err = store.ClaimBatch(ctx, tx, batch)
		check("ClaimBatch", err, "message 2 of 4")
		_, err = store.ClaimSQL(ctx, sqlTx, c.id)
		check("ClaimSQL", err, c.says)
		_, err = store.ClaimBatchSQL(ctx, sqlTx, batch)
		check("ClaimBatchSQL", err, "message 2 of 4")
		_, _, err = store.ProcessResult(ctx, c.id, func(context.Context, pgx.Tx) ([]byte, error) { fnRan = true; return nil, nil })
		check("ProcessResult", err, c.says)
		_, _, err = store.Lookup(ctx, c.id)
		check("Lookup", err, c.says)
		_, err = store.Forget(ctx, c.id)
		check("Forget", err, c.says)
		if fnRan {
			t.Errorf("%s: fn ran", c.name)
		}
	}
	if n := tracer.n.Load() - sent; n != 0 {
		t.Errorf("%d queries sent for invalid input, want 0", n)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("rejected claims broke the caller's transaction: %v", err)
	}
	if err := sqlTx.Commit(); err != nil {
		t.Fatalf("rejected claims broke the caller's database/sql transaction: %v", err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatalf("%d IDs recorded from rejected calls, want 0", n)
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
		"é", "e\u0301", "A", "a", "a ", " a", "\ta\n", "\x7f", "\u00a0a",
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
	b := setup(t, pgdedup.Config{MaxBatch: 100_000})
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

// validID is the model's predicate for a valid ID, written from the
// documentation rather than from the code (FuzzValidateMessageID checks
// ValidateMessageID against the same).
func validID(id string) bool {
	return strings.TrimFunc(id, unicode.IsSpace) != "" && len(id) <= pgdedup.MaxMessageIDLen && utf8.ValidString(id) && !strings.ContainsRune(id, 0)
}

// FuzzValidateMessageID checks ValidateMessageID against validID.
func FuzzValidateMessageID(f *testing.F) {
	for _, c := range invalidIDs {
		if len(c.id) < 2000 {
			f.Add(c.id)
		}
	}
	f.Add("order-42")
	f.Add("é")
	f.Add(strings.Repeat("x", pgdedup.MaxMessageIDLen))
	f.Fuzz(func(t *testing.T, id string) {
		err := pgdedup.ValidateMessageID(id)
		if (err == nil) != validID(id) {
			t.Fatalf("ValidateMessageID(%q) = %v, want valid=%v", id, err, validID(id))
		}
		if err != nil && !errors.Is(err, pgdedup.ErrInvalidMessageID) {
			t.Fatalf("error %v does not wrap ErrInvalidMessageID", err)
		}
	})
}
