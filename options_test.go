package pgdedup_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
)

func TestWithRetention(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{Retention: time.Hour})
	ctx := ctxT(t)
	if _, err := b.store.Process(ctx, "long", charge("long"), pgdedup.WithRetention(14*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Process(ctx, "usual", charge("usual")); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]time.Duration{"long": 14 * 24 * time.Hour, "usual": time.Hour} {
		rec, ok, err := b.store.Lookup(ctx, id)
		if err != nil || !ok || rec.ExpiresAt.Sub(rec.ProcessedAt) != want {
			t.Errorf("%s: %+v, %v, %v; want it to expire %s after it was processed", id, rec, ok, err, want)
		}
	}
	for _, d := range []time.Duration{time.Millisecond, -time.Hour} {
		if _, err := b.store.Process(ctx, "bad", charge("bad"), pgdedup.WithRetention(d)); !errors.Is(err, pgdedup.ErrInvalidOption) {
			t.Errorf("WithRetention(%s): %v, want ErrInvalidOption", d, err)
		}
	}
	margined, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "billing", LateMargin: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := margined.Process(ctx, "bad", charge("bad"), pgdedup.WithRetention(time.Minute)); !errors.Is(err, pgdedup.ErrInvalidOption) {
		t.Errorf("WithRetention not above LateMargin: %v, want ErrInvalidOption", err)
	}
	if recorded(t, b.pool, "billing", "bad") {
		t.Error("bad recorded")
	}
}

func TestLateMessageGuard(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{Retention: 10 * time.Hour, LateMargin: time.Hour})
	ctx := ctxT(t)
	now := time.Now()
	// Retention 10h minus LateMargin 1h: a message sent 9h ago is the last
	// one the guard lets through.
	if _, err := b.store.Process(ctx, "recent", charge("recent"), pgdedup.WithSentAt(now.Add(-8*time.Hour))); err != nil {
		t.Errorf("sent 8h ago: %v", err)
	}
	_, err := b.store.Process(ctx, "late", charge("late"), pgdedup.WithSentAt(now.Add(-9*time.Hour-time.Minute)))
	if !errors.Is(err, pgdedup.ErrTooLate) {
		t.Errorf("sent 9h01m ago: %v, want ErrTooLate", err)
	}
	if recorded(t, b.pool, "billing", "late") {
		t.Error("a late message was recorded")
	}
	// A longer per-message retention moves the guard.
	if _, err := b.store.Process(ctx, "late", charge("late"), pgdedup.WithSentAt(now.Add(-9*time.Hour-time.Minute)), pgdedup.WithRetention(24*time.Hour)); err != nil {
		t.Errorf("sent 9h01m ago with WithRetention(24h): %v", err)
	}
	// The default margin is a tenth of the Retention in force.
	plain, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "emails", Retention: 10 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Process(ctx, "m", charge("m"), pgdedup.WithSentAt(now.Add(-9*time.Hour-time.Minute))); !errors.Is(err, pgdedup.ErrTooLate) {
		t.Errorf("default margin, sent 9h01m ago: %v, want ErrTooLate", err)
	}
	if _, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "x", Retention: time.Hour, LateMargin: time.Hour}); err == nil {
		t.Error("New accepted LateMargin equal to Retention")
	}
}

// Batches take WithSentAt, the earliest time of their messages, as their
// late-message guard; other options are refused. Neither refusal records or
// runs anything.
func TestBatchOptions(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{Retention: 10 * time.Hour, LateMargin: time.Hour})
	ctx := ctxT(t)
	runs := 0
	fn := func(context.Context, pgx.Tx, []string) error { runs++; return nil }
	now := time.Now()
	for _, c := range []struct {
		name string
		opt  pgdedup.Option
		want error
	}{
		{"late", pgdedup.WithSentAt(now.Add(-9*time.Hour - time.Minute)), pgdedup.ErrTooLate},
		{"fingerprint", pgdedup.WithFingerprint([]byte("p")), pgdedup.ErrInvalidOption},
		{"retention", pgdedup.WithRetention(time.Hour * 2), pgdedup.ErrInvalidOption},
		{"result limit", pgdedup.WithMaxResultBytes(10), pgdedup.ErrInvalidOption},
	} {
		if _, err := b.store.ProcessBatch(ctx, []string{"a", "b"}, fn, c.opt); !errors.Is(err, c.want) {
			t.Errorf("ProcessBatch, %s: %v, want %v", c.name, err, c.want)
		}
	}
	if runs != 0 || recorded(t, b.pool, "billing", "a") {
		t.Fatalf("refused batches ran fn %d times or recorded an ID", runs)
	}
	if fresh, err := b.store.ProcessBatch(ctx, []string{"a", "b"}, fn, pgdedup.WithSentAt(now.Add(-8*time.Hour))); err != nil || len(fresh) != 2 || runs != 1 {
		t.Fatalf("sent 8h ago: fresh %v, err %v, %d runs", fresh, err, runs)
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	events := &eventLog{}
	b := setup(t, pgdedup.Config{OnEvent: events.add})
	ctx := ctxT(t)
	a, z := []byte("sha256-of-payload-a"), []byte("sha256-of-payload-z")

	if processed, err := b.store.Process(ctx, "order-1", charge("order-1"), pgdedup.WithFingerprint(a)); err != nil || !processed {
		t.Fatalf("first delivery: %v, %v", processed, err)
	}
	if processed, err := b.store.Process(ctx, "order-1", charge("order-1"), pgdedup.WithFingerprint(a)); err != nil || processed {
		t.Errorf("same ID, same payload: %v, %v; want a plain duplicate", processed, err)
	}
	processed, err := b.store.Process(ctx, "order-1", charge("order-1"), pgdedup.WithFingerprint(z))
	var mismatch *pgdedup.PayloadMismatchError
	if processed || !errors.Is(err, pgdedup.ErrPayloadMismatch) || !errors.As(err, &mismatch) ||
		!bytes.Equal(mismatch.Stored, a) || !bytes.Equal(mismatch.Given, z) || mismatch.MessageID != "order-1" {
		t.Errorf("same ID, other payload: %v, %v; want a PayloadMismatchError with both fingerprints", processed, err)
	}
	if processed, err := b.store.Process(ctx, "order-1", charge("order-1")); err != nil || processed {
		t.Errorf("a delivery without a fingerprint: %v, %v; want a plain duplicate", processed, err)
	}
	if n := chargesPerOrder(t, b.pool)["order-1"]; n != 1 {
		t.Errorf("order-1 charged %d times, want 1", n)
	}
	var kinds []pgdedup.EventKind
	for _, e := range events.events {
		kinds = append(kinds, e.Kind)
		if e.Kind == pgdedup.EventPayloadMismatch && (e.MessageID != "order-1" || !errors.Is(e.Err, pgdedup.ErrPayloadMismatch)) {
			t.Errorf("mismatch event: %+v", e)
		}
	}
	want := []pgdedup.EventKind{pgdedup.EventProcessed, pgdedup.EventDuplicate, pgdedup.EventPayloadMismatch, pgdedup.EventDuplicate}
	if !slices.Equal(kinds, want) {
		t.Errorf("events %v, want %v", kinds, want)
	}

	// An ID recorded without a fingerprint has nothing to compare.
	if _, err := b.store.Process(ctx, "order-2", charge("order-2")); err != nil {
		t.Fatal(err)
	}
	if processed, err := b.store.Process(ctx, "order-2", charge("order-2"), pgdedup.WithFingerprint(z)); err != nil || processed {
		t.Errorf("fingerprint against a row without one: %v, %v; want a plain duplicate", processed, err)
	}

	// WithFingerprint(nil) and WithFingerprint([]byte{}) alike are refused:
	// a call without a fingerprint leaves the option out.
	for _, fp := range [][]byte{nil, {}, make([]byte, pgdedup.MaxFingerprintLen+1)} {
		if _, err := b.store.Process(ctx, "order-3", charge("order-3"), pgdedup.WithFingerprint(fp)); !errors.Is(err, pgdedup.ErrInvalidOption) {
			t.Errorf("fingerprint %#v of %d bytes: %v, want ErrInvalidOption", fp, len(fp), err)
		}
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := b.store.Claim(ctx, tx, "order-3", pgdedup.WithFingerprint(fp))
			return err
		})
		if !errors.Is(err, pgdedup.ErrInvalidOption) {
			t.Errorf("Claim with fingerprint %#v of %d bytes: %v, want ErrInvalidOption", fp, len(fp), err)
		}
	}
	if recorded(t, b.pool, "billing", "order-3") {
		t.Error("order-3 recorded after invalid options")
	}
}

// In the caller's transaction, a mismatch leaves tx usable, as a duplicate
// does; with database/sql too.
func TestFingerprintClaim(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	a, z := []byte{1}, []byte{2}
	if _, err := b.store.Process(ctx, "order-1", charge("order-1"), pgdedup.WithFingerprint(a)); err != nil {
		t.Fatal(err)
	}
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if claimed, err := b.store.Claim(ctx, tx, "order-1", pgdedup.WithFingerprint(z)); claimed || !errors.Is(err, pgdedup.ErrPayloadMismatch) {
			t.Errorf("Claim with another fingerprint: %v, %v", claimed, err)
		}
		if claimed, err := b.store.Claim(ctx, tx, "order-2", pgdedup.WithFingerprint(z)); !claimed || err != nil {
			t.Errorf("Claim of a new ID after a mismatch: %v, %v", claimed, err)
		}
		return charge("order-2")(ctx, tx)
	})
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(b.pool)
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if claimed, err := b.store.ClaimSQL(ctx, tx, "order-2", pgdedup.WithFingerprint(a)); claimed || !errors.Is(err, pgdedup.ErrPayloadMismatch) {
		t.Errorf("ClaimSQL with another fingerprint: %v, %v", claimed, err)
	}
	if claimed, err := b.store.ClaimSQL(ctx, tx, "order-2", pgdedup.WithFingerprint(z)); claimed || err != nil {
		t.Errorf("ClaimSQL with the same fingerprint: %v, %v", claimed, err)
	}
}

// A delivery that waited for the first one in flight compares with the
// fingerprint that one committed.
func TestFingerprintAfterWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	pool, app := namedPool(t, b)
	waiter, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	if claimed, err := b.store.Claim(ctx, first, "order-1", pgdedup.WithFingerprint([]byte("a"))); !claimed || err != nil {
		t.Fatal(claimed, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Process(ctx, "order-1", charge("order-1"), pgdedup.WithFingerprint([]byte("z")))
		done <- err
	}()
	waitForLockWait(t, b, app)
	if err := charge("order-1")(ctx, first); err != nil {
		t.Fatal(err)
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, pgdedup.ErrPayloadMismatch) {
		t.Errorf("the waiting delivery: %v, want ErrPayloadMismatch", err)
	}
	if n := chargesPerOrder(t, b.pool)["order-1"]; n != 1 {
		t.Errorf("order-1 charged %d times, want 1", n)
	}
}

// A mismatch's error text, and so logs and the OTel contrib's spans, never
// shows a fingerprint: an unkeyed SHA-256 of a small payload such as a PIN is
// recovered by trying every payload (issue 26 §6).
func TestPayloadMismatchErrorHidesFingerprints(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	first, second := sha256.Sum256([]byte(`{"pin":"7345"}`)), sha256.Sum256([]byte(`{"pin":"7346"}`))
	if _, err := b.store.Process(ctx, "pin-1", charge("pin-1"), pgdedup.WithFingerprint(first[:])); err != nil {
		t.Fatal(err)
	}
	_, err := b.store.Process(ctx, "pin-1", charge("pin-1"), pgdedup.WithFingerprint(second[:]))
	if !errors.Is(err, pgdedup.ErrPayloadMismatch) || !strings.Contains(err.Error(), `"pin-1"`) {
		t.Fatalf("%v, want ErrPayloadMismatch naming the ID", err)
	}
	if leak := hexLeak(err.Error(), first[:], second[:]); leak != "" {
		t.Errorf("the error %q shows %q of a fingerprint", err, leak)
	}
}

// hexLeak returns a run of 6 hex digits of one of fps found in text, or "".
// Shorter runs occur by chance.
func hexLeak(text string, fps ...[]byte) string {
	text = strings.ToLower(text)
	for _, fp := range fps {
		h := hex.EncodeToString(fp)
		for i := 0; i+6 <= len(h); i++ {
			if strings.Contains(text, h[i:i+6]) {
				return h[i : i+6]
			}
		}
	}
	return ""
}

// optionCall is one call that takes per-call options, run in a transaction
// of its own (Claim and ClaimSQL commit theirs unless the claim fails).
// result is what fn answers, for ProcessResult. ran reports whether fn ran.
type optionCall func(ctx context.Context, b *bundle, id string, result []byte, opts ...pgdedup.Option) (ran bool, err error)

// optionCalls are the calls whose last parameter is ...Option, by name.
var optionCalls = map[string]optionCall{
	"Process": func(ctx context.Context, b *bundle, id string, _ []byte, opts ...pgdedup.Option) (ran bool, err error) {
		_, err = b.store.Process(ctx, id, func(context.Context, pgx.Tx) error { ran = true; return nil }, opts...)
		return ran, err
	},
	"ProcessResult": func(ctx context.Context, b *bundle, id string, result []byte, opts ...pgdedup.Option) (ran bool, err error) {
		_, _, err = b.store.ProcessResult(ctx, id, func(context.Context, pgx.Tx) ([]byte, error) { ran = true; return result, nil }, opts...)
		return ran, err
	},
	"Claim": func(ctx context.Context, b *bundle, id string, _ []byte, opts ...pgdedup.Option) (ran bool, err error) {
		err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			ran, err = b.store.Claim(ctx, tx, id, opts...)
			return err
		})
		return ran, err
	},
	"ClaimSQL": func(ctx context.Context, b *bundle, id string, _ []byte, opts ...pgdedup.Option) (ran bool, err error) {
		db := stdlib.OpenDBFromPool(b.pool)
		defer db.Close()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return false, err
		}
		defer tx.Rollback() //nolint:errcheck // no-op after Commit
		if ran, err = b.store.ClaimSQL(ctx, tx, id, opts...); err != nil {
			return ran, err
		}
		return ran, tx.Commit()
	},
	"ProcessBatch": func(ctx context.Context, b *bundle, id string, _ []byte, opts ...pgdedup.Option) (ran bool, err error) {
		_, err = b.store.ProcessBatch(ctx, []string{id}, func(context.Context, pgx.Tx, []string) error { ran = true; return nil }, opts...)
		return ran, err
	},
	"ClaimBatch": func(ctx context.Context, b *bundle, id string, _ []byte, opts ...pgdedup.Option) (ran bool, err error) {
		err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			fresh, err := b.store.ClaimBatch(ctx, tx, []string{id}, opts...)
			ran = len(fresh) == 1
			return err
		})
		return ran, err
	},
	"ClaimBatchSQL": func(ctx context.Context, b *bundle, id string, _ []byte, opts ...pgdedup.Option) (ran bool, err error) {
		db := stdlib.OpenDBFromPool(b.pool)
		defer db.Close()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return false, err
		}
		defer tx.Rollback() //nolint:errcheck // no-op after Commit
		fresh, err := b.store.ClaimBatchSQL(ctx, tx, []string{id}, opts...)
		if err != nil {
			return false, err
		}
		return len(fresh) == 1, tx.Commit()
	},
}

// optionChecks say, for each Option, how a call shows that it took effect.
// A check returns an error when the option did not take effect.
var optionChecks = map[string]func(t *testing.T, ctx context.Context, b *bundle, call optionCall) error{
	// A second delivery with another fingerprint is a mismatch.
	"WithFingerprint": func(t *testing.T, ctx context.Context, b *bundle, call optionCall) error {
		if _, err := call(ctx, b, "m", nil, pgdedup.WithFingerprint([]byte("a"))); err != nil {
			return err
		}
		if _, err := call(ctx, b, "m", nil, pgdedup.WithFingerprint([]byte("b"))); !errors.Is(err, pgdedup.ErrPayloadMismatch) {
			return fmt.Errorf("another fingerprint: %v, want ErrPayloadMismatch", err)
		}
		return nil
	},
	// The row expires after the call's retention, not the Store's hour.
	"WithRetention": func(t *testing.T, ctx context.Context, b *bundle, call optionCall) error {
		if _, err := call(ctx, b, "m", nil, pgdedup.WithRetention(3*time.Hour)); err != nil {
			return err
		}
		rec, ok, err := b.store.Lookup(ctx, "m")
		if err != nil || !ok {
			return fmt.Errorf("Lookup: %v, %v", ok, err)
		}
		if kept := rec.ExpiresAt.Sub(rec.ProcessedAt); kept < 2*time.Hour {
			return fmt.Errorf("row kept %s, want 3h", kept)
		}
		return nil
	},
	// A message sent two Retentions ago is too late.
	"WithSentAt": func(t *testing.T, ctx context.Context, b *bundle, call optionCall) error {
		if _, err := call(ctx, b, "m", nil, pgdedup.WithSentAt(time.Now().Add(-2*time.Hour))); !errors.Is(err, pgdedup.ErrTooLate) {
			return fmt.Errorf("a message sent 2h ago: %v, want ErrTooLate", err)
		}
		return nil
	},
	// A result longer than the call's limit fails the call.
	"WithMaxResultBytes": func(t *testing.T, ctx context.Context, b *bundle, call optionCall) error {
		_, err := call(ctx, b, "m", []byte("longer than 4"), pgdedup.WithMaxResultBytes(4))
		if errors.Is(err, pgdedup.ErrInvalidOption) {
			return err
		}
		if !errors.Is(err, pgdedup.ErrResultTooLarge) {
			return fmt.Errorf("a result over WithMaxResultBytes(4): %v, want ErrResultTooLarge", err)
		}
		return nil
	},
}

// optionRefusals are the options each call refuses with ErrInvalidOption.
var optionRefusals = map[string][]string{
	"Process":  {"WithMaxResultBytes"},
	"Claim":    {"WithMaxResultBytes"},
	"ClaimSQL": {"WithMaxResultBytes"},
	// A batch takes its earliest time only.
	"ProcessBatch":  {"WithFingerprint", "WithMaxResultBytes", "WithRetention"},
	"ClaimBatch":    {"WithFingerprint", "WithMaxResultBytes", "WithRetention"},
	"ClaimBatchSQL": {"WithFingerprint", "WithMaxResultBytes", "WithRetention"},
}

// Every Option passed to every call that takes options either takes effect
// or is refused with ErrInvalidOption before anything is sent. None is
// silently ignored. The lists above must name every With… function and
// every Store method taking ...Option, which the test reads from the source.
func TestEveryOptionOnEveryCall(t *testing.T) {
	t.Parallel()
	options, calls := optionAPI(t)
	if !slices.Equal(options, slices.Sorted(maps.Keys(optionChecks))) {
		t.Fatalf("options in options.go %q, checked here %q", options, slices.Sorted(maps.Keys(optionChecks)))
	}
	if !slices.Equal(calls, slices.Sorted(maps.Keys(optionCalls))) {
		t.Fatalf("Store methods taking ...Option %q, called here %q", calls, slices.Sorted(maps.Keys(optionCalls)))
	}
	for _, callName := range calls {
		for _, option := range options {
			t.Run(callName+"/"+option, func(t *testing.T) {
				t.Parallel()
				b := setup(t, pgdedup.Config{Retention: time.Hour})
				ctx := ctxT(t)
				err := optionChecks[option](t, ctx, b, optionCalls[callName])
				if !slices.Contains(optionRefusals[callName], option) {
					if err != nil {
						t.Errorf("%s did not take effect: %v", option, err)
					}
					return
				}
				if !errors.Is(err, pgdedup.ErrInvalidOption) || !strings.Contains(err.Error(), callName) {
					t.Errorf("%s: %v, want ErrInvalidOption naming %s", option, err, callName)
				}
				if _, ok, err := b.store.Lookup(ctx, "m"); ok || err != nil {
					t.Errorf("a refused option recorded the ID: %v, %v", ok, err)
				}
			})
		}
	}
}

// A refused option is refused before the database is touched: a nil
// transaction is not even looked at.
func TestRefusedOptionSendsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	if _, err := b.store.Claim(ctx, nil, "m", pgdedup.WithMaxResultBytes(10)); !errors.Is(err, pgdedup.ErrInvalidOption) {
		t.Errorf("Claim in a nil tx with WithMaxResultBytes: %v, want ErrInvalidOption", err)
	}
	if _, err := b.store.ClaimSQL(ctx, nil, "m", pgdedup.WithMaxResultBytes(10)); !errors.Is(err, pgdedup.ErrInvalidOption) {
		t.Errorf("ClaimSQL in a nil tx with WithMaxResultBytes: %v, want ErrInvalidOption", err)
	}
}

// optionAPI reads the root package's source and returns, sorted, the
// functions that return an Option and the Store methods whose last
// parameter is ...Option. Deprecated aliases are left out.
func optionAPI(t *testing.T) (options, calls []string) {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || !fd.Name.IsExported() {
				continue
			}
			if fd.Recv == nil {
				if r := fd.Type.Results; r != nil && len(r.List) == 1 && types.ExprString(r.List[0].Type) == "Option" {
					options = append(options, fd.Name.Name)
				}
				continue
			}
			params := fd.Type.Params.List
			if types.ExprString(fd.Recv.List[0].Type) == "*Store" && len(params) > 0 && types.ExprString(params[len(params)-1].Type) == "...Option" {
				calls = append(calls, fd.Name.Name)
			}
		}
	}
	slices.Sort(options)
	slices.Sort(calls)
	return options, calls
}
