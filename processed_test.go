package pgdedup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// Accepted table names are quoted, so case is kept and a name that looks like
// SQL is only ever a name.
func TestTableNamesAreQuoted(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	mustExec(t, b.pool, `CREATE TABLE "Select$" (LIKE processed_messages INCLUDING ALL)`)
	for _, table := range []string{"Select$", b.db.Schema + ".Select$"} {
		store, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "billing", Table: table})
		if err != nil {
			t.Fatalf("New with Table %q: %v", table, err)
		}
		if _, err := store.Process(ctx, "m-"+table, charge("o")); err != nil {
			t.Fatalf("Process with Table %q: %v", table, err)
		}
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM "Select$"`); n != 2 {
		t.Fatalf(`"Select$" has %d rows, want 2`, n)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatalf("processed_messages has %d rows, want 0", n)
	}
}

func TestConsumersAreIndependent(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{Consumer: "billing"})
	ctx := ctxT(t)
	emails, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "emails"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*pgdedup.Store{b.store, emails, b.store, emails} {
		if _, err := s.Process(ctx, "msg-1", charge("order-"+s.Consumer())); err != nil {
			t.Fatal(err)
		}
	}
	got := chargesPerOrder(t, b.pool)
	if got["order-billing"] != 1 || got["order-emails"] != 1 {
		t.Fatalf("charges %v, want one per consumer", got)
	}
}

var (
	_ pgdedup.DB = (*pgxpool.Pool)(nil)
	_ pgdedup.DB = (*pgx.Conn)(nil)
)

func TestSchemaQualifiedTable(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	store, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "billing", Table: b.db.Schema + ".processed_messages"})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := store.Process(ctx, "m", charge("m")); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if !recorded(t, b.pool, "billing", "m") {
		t.Fatal("not recorded in the qualified table")
	}
}

func TestProcessNewThenDuplicate(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	b := setup(t, pgdedup.Config{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	ctx := ctxT(t)

	processed, err := b.store.Process(ctx, "msg-1", charge("order-1"))
	if err != nil || !processed {
		t.Fatalf("first delivery: processed=%v err=%v, want true, nil", processed, err)
	}
	calls := 0
	processed, err = b.store.Process(ctx, "msg-1", func(ctx context.Context, tx pgx.Tx) error {
		calls++
		return charge("order-1")(ctx, tx)
	})
	if err != nil || processed || calls != 0 {
		t.Fatalf("duplicate: processed=%v err=%v fn calls=%d, want false, nil, 0", processed, err, calls)
	}
	if got := chargesPerOrder(t, b.pool); got["order-1"] != 1 {
		t.Fatalf("order-1 charged %d times, want 1", got["order-1"])
	}
	if !recorded(t, b.pool, "billing", "msg-1") {
		t.Fatal("msg-1 not recorded")
	}
	if !strings.Contains(logs.String(), "skipped duplicate") || !strings.Contains(logs.String(), "msg-1") {
		t.Fatalf("duplicate not logged; log:\n%s", logs.String())
	}
	if n := acquiredConns(b.pool); n != 0 {
		t.Fatalf("%d connections still acquired", n)
	}
}

func TestProcessRecordsExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{Retention: 90 * time.Minute})
	ctx := ctxT(t)
	if _, err := b.store.Process(ctx, "m", charge("o")); err != nil {
		t.Fatal(err)
	}
	var secs float64
	err := b.pool.QueryRow(ctx, `SELECT extract(epoch FROM expires_at - processed_at) FROM processed_messages WHERE message_id = 'm'`).Scan(&secs)
	if err != nil {
		t.Fatal(err)
	}
	if secs != 90*60 {
		t.Fatalf("expires_at - processed_at = %vs, want 5400s (Retention)", secs)
	}
}

func TestProcessFnErrorRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	errDeclined := errors.New("card declined")
	processed, err := b.store.Process(ctx, "msg-1", func(ctx context.Context, tx pgx.Tx) error {
		if err := charge("order-1")(ctx, tx); err != nil {
			return err
		}
		return fmt.Errorf("charging: %w", errDeclined)
	})
	if !errors.Is(err, errDeclined) || processed {
		t.Fatalf("processed=%v err=%v, want false and the fn's error", processed, err)
	}
	if recorded(t, b.pool, "billing", "msg-1") || len(chargesPerOrder(t, b.pool)) != 0 {
		t.Fatal("a failed fn left the ID or the charge behind")
	}
	// The redelivery is processed.
	processed, err = b.store.Process(ctx, "msg-1", charge("order-1"))
	if err != nil || !processed {
		t.Fatalf("redelivery: processed=%v err=%v", processed, err)
	}
	if got := chargesPerOrder(t, b.pool)["order-1"]; got != 1 {
		t.Fatalf("order-1 charged %d times, want 1", got)
	}
}

func TestProcessFnPanicRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the fn's panic", r)
			}
		}()
		_, _ = b.store.Process(ctx, "msg-1", func(ctx context.Context, tx pgx.Tx) error {
			if err := charge("order-1")(ctx, tx); err != nil {
				return err
			}
			panic("boom")
		})
	}()
	if recorded(t, b.pool, "billing", "msg-1") || len(chargesPerOrder(t, b.pool)) != 0 {
		t.Fatal("a panicking fn left the ID or the charge behind")
	}
	if n := acquiredConns(b.pool); n != 0 {
		t.Fatalf("panic leaked %d connections", n)
	}
}

// A single *pgx.Conn works as the Store's DB too (used from one goroutine).
func TestProcessOnConn(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	conn, err := pgx.Connect(ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	store, err := pgdedup.New(conn, pgdedup.Config{Consumer: "billing", LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		if ok, err := store.Process(ctx, "m", charge("o")); ok != want || err != nil {
			t.Fatalf("Process #%d = %v, %v; want %v", i+1, ok, err, want)
		}
	}
	errBoom := errors.New("boom")
	if _, err := store.Process(ctx, "n", func(context.Context, pgx.Tx) error { return errBoom }); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	if conn.PgConn().TxStatus() != 'I' {
		t.Fatalf("connection left in transaction status %q", conn.PgConn().TxStatus())
	}
	if got := chargesPerOrder(t, b.pool); got["o"] != 1 || len(got) != 1 {
		t.Fatalf("charges %v", got)
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

// Many consumers receive the same few hundred messages in random order; each
// order must be charged exactly once and each processed=true counted once.
func TestProcessConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	const ids, workers, rounds = 200, 16, 2
	var processed atomic.Int64
	pgtest.FanOut(t, workers, func(w int) error {
		for _, i := range rand.Perm(ids * rounds) {
			id := fmt.Sprintf("msg-%d", i%ids)
			ok, err := b.store.Process(ctx, id, charge(id))
			if err != nil {
				return fmt.Errorf("worker %d: %w", w, err)
			}
			if ok {
				processed.Add(1)
			}
		}
		return nil
	})
	got := chargesPerOrder(t, b.pool)
	if len(got) != ids {
		t.Fatalf("%d orders charged, want %d", len(got), ids)
	}
	for id, n := range got {
		if n != 1 {
			t.Fatalf("%s charged %d times", id, n)
		}
	}
	if processed.Load() != ids {
		t.Fatalf("Process reported %d new messages, want %d", processed.Load(), ids)
	}
}

func TestDuplicateWaitsForInFlight(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("first commits=%v", commit), func(t *testing.T) {
			t.Parallel()
			b := setup(t, pgdedup.Config{})
			ctx := ctxT(t)
			first := pgtest.HoldClaim(t, b.pool, b.store, "msg-1")
			if err := charge("msg-1")(ctx, first); err != nil {
				t.Fatal(err)
			}

			type result struct {
				processed bool
				err       error
			}
			done := make(chan result, 1)
			go func() {
				p, err := b.store.Process(ctx, "msg-1", charge("msg-1"))
				done <- result{p, err}
			}()
			select {
			case r := <-done:
				t.Fatalf("duplicate returned %+v while the first delivery was in flight", r)
			case <-time.After(300 * time.Millisecond):
			}
			var err error
			if commit {
				err = first.Commit(ctx)
			} else {
				err = first.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil || r.processed == commit {
				t.Fatalf("after the first delivery ended (commit=%v): processed=%v err=%v", commit, r.processed, r.err)
			}
			if got := chargesPerOrder(t, b.pool)["msg-1"]; got != 1 {
				t.Fatalf("msg-1 charged %d times, want 1", got)
			}
		})
	}
}

func TestLockTimeoutReturnsErrInFlight(t *testing.T) {
	t.Parallel()
	var inFlight atomic.Int64
	b := setup(t, pgdedup.Config{LockTimeout: 100 * time.Millisecond, OnEvent: func(_ context.Context, e pgdedup.Event) {
		if e.Kind == pgdedup.EventInFlight {
			inFlight.Add(e.Count)
		}
	}})
	ctx := ctxT(t)
	first := pgtest.HoldClaim(t, b.pool, b.store, "msg-1")
	if err := charge("msg-1")(ctx, first); err != nil {
		t.Fatal(err)
	}

	// The holder stays open and the session has no lock_timeout of its own:
	// only LockTimeout can end the wait with ErrInFlight.
	calls := 0
	processed, err := b.store.Process(ctx, "msg-1", func(context.Context, pgx.Tx) error { calls++; return nil })
	if !errors.Is(err, pgdedup.ErrInFlight) || processed || calls != 0 {
		t.Fatalf("processed=%v err=%v calls=%d, want ErrInFlight and fn not called", processed, err, calls)
	}
	if inFlight.Load() != 1 {
		t.Fatalf("%d messages reported in flight, want 1", inFlight.Load())
	}
	// A batch gives up whole, and reports each of its distinct IDs.
	fresh, err := b.store.ProcessBatch(ctx, []string{"x", "msg-1", "y", "x"}, func(context.Context, pgx.Tx, []string) error { calls++; return nil })
	if !errors.Is(err, pgdedup.ErrInFlight) || len(fresh) != 0 || calls != 0 {
		t.Fatalf("batch: fresh=%v err=%v calls=%d, want ErrInFlight and fn not called", fresh, err, calls)
	}
	if inFlight.Load() != 1+3 {
		t.Fatalf("%d messages reported in flight, want 1 and then the batch's 3", inFlight.Load())
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := chargesPerOrder(t, b.pool)["msg-1"]; got != 1 {
		t.Fatalf("msg-1 charged %d times, want 1", got)
	}
	// The lock timeout applies to the claim only: a new message's fn can wait
	// longer than LockTimeout for a lock of its own.
	mustExec(t, b.pool, `INSERT INTO charges (order_id) VALUES ('locked')`)
	blocker, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(ctx, `UPDATE charges SET consumer = 'x' WHERE order_id = 'locked'`); err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	time.AfterFunc(400*time.Millisecond, func() { _ = blocker.Rollback(ctx); close(released) })
	defer func() { <-released }()
	_, err = b.store.Process(ctx, "msg-2", func(ctx context.Context, tx pgx.Tx) error {
		var lt string
		if err := tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&lt); err != nil {
			return err
		}
		if lt != "0" {
			return fmt.Errorf("fn runs with lock_timeout %s, want the session's 0", lt)
		}
		_, err := tx.Exec(ctx, `UPDATE charges SET consumer = 'y' WHERE order_id = 'locked'`)
		return err
	})
	if err != nil {
		t.Fatalf("fn waiting on its own lock: %v", err)
	}
}

// Under repeatable read a concurrent duplicate surfaces as a serialization
// failure instead of a wait; the retry sees the committed row and skips.
func TestProcessConcurrentDuplicatesRepeatableRead(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, MaxAttempts: 20})
	ctx := ctxT(t)
	const ids, workers = 50, 8
	pgtest.FanOut(t, workers, func(int) error {
		for _, i := range rand.Perm(ids) {
			id := fmt.Sprint("msg-", i)
			if _, err := b.store.Process(ctx, id, charge(id)); err != nil {
				return err
			}
		}
		return nil
	})
	got := chargesPerOrder(t, b.pool)
	for i := range ids {
		if id := fmt.Sprint("msg-", i); got[id] != 1 {
			t.Fatalf("%s charged %d times, want 1", id, got[id])
		}
	}
}

// A 100,000-ID batch is one statement; a second, overlapping one gets exactly
// its new IDs, in input order, each once although repeated.
func TestHundredThousandIDBatches(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{MaxBatch: 200_000})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute) // 210,000 IDs on a busy machine
	defer cancel()
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

// IDs imported by raw SQL with their original times on the plain table
// (no key: the trigger fills it) are duplicates until their expires_at, and
// deleted by Cleanup after it, not before; then they are forgotten.
func TestImportRawSQL(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	mustExec(t, b.pool, `INSERT INTO processed_messages (consumer, message_id, processed_at, expires_at) VALUES
('billing', 'imported-1', now() - interval '30 hours', now() + interval '1 minute'),
('billing', 'imported-2', now() - interval '5 seconds', now() + interval '1 minute')`)
	if _, err := b.store.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"imported-1", "imported-2"} {
		if processed, err := b.store.Process(ctx, id, charge(id)); err != nil || processed {
			t.Fatalf("%s after the import and a Cleanup: processed=%v err=%v, want a duplicate", id, processed, err)
		}
	}
	expire(t, b, "billing")
	if deleted, err := b.store.Cleanup(ctx); err != nil || deleted != 2 {
		t.Fatalf("Cleanup once they expired: deleted %d, %v; want 2", deleted, err)
	}
	for _, id := range []string{"imported-1", "imported-2"} {
		if processed, err := b.store.Process(ctx, id, charge(id)); err != nil || !processed {
			t.Errorf("%s once expired and cleaned up: processed=%v err=%v, want processed", id, processed, err)
		}
	}
}

// reply is a request handler's fn: it charges the order and answers with the
// charge's ID, different each time it runs.
func reply(orderID string) func(context.Context, pgx.Tx) ([]byte, error) {
	return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO charges (order_id) VALUES ($1) RETURNING id`, orderID).Scan(&id)
		return fmt.Appendf(nil, "charge %d", id), err
	}
}

func TestProcessResult(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{MaxResultBytes: 100})
	ctx := ctxT(t)
	first, processed, err := b.store.ProcessResult(ctx, "req-1", reply("req-1"))
	if err != nil || !processed || len(first) == 0 {
		t.Fatalf("first delivery: %q, %v, %v", first, processed, err)
	}
	again, processed, err := b.store.ProcessResult(ctx, "req-1", reply("req-1"))
	if err != nil || processed || string(again) != string(first) {
		t.Errorf("duplicate: %q, %v, %v; want the first answer %q", again, processed, err, first)
	}
	if n := chargesPerOrder(t, b.pool)["req-1"]; n != 1 {
		t.Errorf("req-1 charged %d times, want 1", n)
	}

	// An ID recorded without a result: nil. An empty result stays empty.
	if _, err := b.store.Process(ctx, "req-2", charge("req-2")); err != nil {
		t.Fatal(err)
	}
	if res, processed, err := b.store.ProcessResult(ctx, "req-2", reply("req-2")); err != nil || processed || res != nil {
		t.Errorf("duplicate of an ID without a result: %q, %v, %v", res, processed, err)
	}
	empty := func(context.Context, pgx.Tx) ([]byte, error) { return []byte{}, nil }
	if _, _, err := b.store.ProcessResult(ctx, "req-3", empty); err != nil {
		t.Fatal(err)
	}
	if res, _, err := b.store.ProcessResult(ctx, "req-3", empty); err != nil || res == nil || len(res) != 0 {
		t.Errorf("duplicate of an empty result: %#v, %v", res, err)
	}

	// Too large: nothing is kept, neither the charge nor the ID.
	big := func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, err := reply("req-4")(ctx, tx)
		return make([]byte, 101), err
	}
	if _, _, err := b.store.ProcessResult(ctx, "req-4", big); !errors.Is(err, pgdedup.ErrResultTooLarge) || !strings.Contains(err.Error(), "101 bytes") {
		t.Errorf("a result of 101 bytes with MaxResultBytes 100: %v", err)
	}
	if recorded(t, b.pool, "billing", "req-4") || chargesPerOrder(t, b.pool)["req-4"] != 0 {
		t.Error("req-4 recorded or charged after ErrResultTooLarge")
	}

	// fn's error: nothing kept, the error as is.
	boom := errors.New("boom")
	if _, _, err := b.store.ProcessResult(ctx, "req-5", func(context.Context, pgx.Tx) ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Errorf("fn's error: %v", err)
	}
	if recorded(t, b.pool, "billing", "req-5") {
		t.Error("req-5 recorded after fn failed")
	}
}

// A duplicate that arrives while the first delivery is in flight waits for
// its answer, or gives up with LockTimeout.
func TestProcessResultInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	pool, app := namedPool(t, b)
	waiter, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	bounded, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "billing", LockTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}

	release := make(chan struct{})
	started := make(chan struct{})
	firstDone := make(chan error, 1)
	go func() {
		_, _, err := b.store.ProcessResult(ctx, "req-1", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			close(started)
			<-release
			return []byte("first answer"), nil
		})
		firstDone <- err
	}()
	<-started
	if _, _, err := bounded.ProcessResult(ctx, "req-1", reply("req-1")); !errors.Is(err, pgdedup.ErrInFlight) {
		t.Errorf("duplicate in flight with LockTimeout: %v, want ErrInFlight", err)
	}
	type answer struct {
		res       []byte
		processed bool
		err       error
	}
	second := make(chan answer, 1)
	go func() {
		res, processed, err := waiter.ProcessResult(ctx, "req-1", reply("req-1"))
		second <- answer{res, processed, err}
	}()
	waitForLockWait(t, b, app)
	close(release)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	if a := <-second; a.err != nil || a.processed || string(a.res) != "first answer" {
		t.Errorf("duplicate that waited: %q, %v, %v; want the first answer", a.res, a.processed, a.err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM charges`); n != 0 {
		t.Errorf("%d charges, want none: only the first delivery ran, and it charged nothing", n)
	}
}

// An expired row (past expires_at) that Cleanup has not deleted yet is still
// the ID's record, on both layouts and for both calls: an ID is a duplicate
// until its row is deleted. ProcessResult returns the stored answer (the
// consumer replies with it and acks), Process reports a duplicate, fn does not
// run again, and the fingerprint is compared: a reused ID with another payload
// is a mismatch, never another request's answer. Once the row is gone, the ID
// is new.
func TestExpiredRowIsADuplicateUntilDeleted(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{"plain", "partitioned"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			var b *bundle
			if layout == "plain" {
				b = setup(t, pgdedup.Config{})
			} else {
				b = setupPartitioned(t, pgdedup.Config{Retention: time.Hour})
			}
			ctx := ctxT(t)
			a, z := pgdedup.WithFingerprint([]byte("payload a")), pgdedup.WithFingerprint([]byte("payload z"))
			first, _, err := b.store.ProcessResult(ctx, "req-1", reply("req-1"), a)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.store.Process(ctx, "order-1", charge("order-1"), a); err != nil {
				t.Fatal(err)
			}
			expire(t, b, "billing")
			for _, opt := range []pgdedup.Option{a, nil} {
				res, processed, err := b.store.ProcessResult(ctx, "req-1", reply("req-1"), opt)
				if err != nil || processed || string(res) != string(first) {
					t.Errorf("ProcessResult, expired row: %q, %v, %v; want the first answer %q as a duplicate", res, processed, err, first)
				}
				if processed, err := b.store.Process(ctx, "order-1", charge("order-1"), opt); err != nil || processed {
					t.Errorf("Process, expired row: %v, %v; want a duplicate", processed, err)
				}
			}
			if res, _, err := b.store.ProcessResult(ctx, "req-1", reply("req-1"), z); !errors.Is(err, pgdedup.ErrPayloadMismatch) || res != nil {
				t.Errorf("ProcessResult, expired row, other payload: %q, %v; want ErrPayloadMismatch", res, err)
			}
			if _, err := b.store.Process(ctx, "order-1", charge("order-1"), z); !errors.Is(err, pgdedup.ErrPayloadMismatch) {
				t.Errorf("Process, expired row, other payload: %v; want ErrPayloadMismatch", err)
			}
			if n := chargesPerOrder(t, b.pool); n["req-1"] != 1 || n["order-1"] != 1 {
				t.Errorf("charges %v, want one each: fn ran again for an expired row", n)
			}
			// Once the row is deleted, the ID is new again.
			for _, id := range []string{"req-1", "order-1"} {
				if forgotten, err := b.store.Forget(ctx, id); err != nil || !forgotten {
					t.Fatalf("Forget %s: %v, %v", id, forgotten, err)
				}
			}
			if res, processed, err := b.store.ProcessResult(ctx, "req-1", reply("req-1"), z); err != nil || !processed || string(res) == string(first) {
				t.Errorf("after Forget: %q, %v, %v; want processed with a new answer", res, processed, err)
			}
			if processed, err := b.store.Process(ctx, "order-1", charge("order-1"), z); err != nil || !processed {
				t.Errorf("Process after Forget: %v, %v; want processed", processed, err)
			}
		})
	}
}

// On the plain layout Cleanup deletes an expired row: its ID is new again.
func TestProcessResultAfterCleanup(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	first, _, err := b.store.ProcessResult(ctx, "req-1", reply("req-1"))
	if err != nil {
		t.Fatal(err)
	}
	expire(t, b, "billing")
	if _, err := b.store.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if res, processed, err := b.store.ProcessResult(ctx, "req-1", reply("req-1")); err != nil || !processed || string(res) == string(first) {
		t.Errorf("after Cleanup: %q, %v, %v; want processed with a new answer", res, processed, err)
	}
}

// WithMaxResultBytes sets one call's limit above or below
// Config.MaxResultBytes; a limit that is not positive is refused before
// anything is sent.
func TestWithMaxResultBytes(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{MaxResultBytes: 10})
	ctx := ctxT(t)
	sized := func(n int) func(context.Context, pgx.Tx) ([]byte, error) {
		return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			_, err := reply("sized")(ctx, tx)
			return []byte(strings.Repeat("x", n)), err
		}
	}
	res, processed, err := b.store.ProcessResult(ctx, "big", sized(1000), pgdedup.WithMaxResultBytes(1000))
	if err != nil || !processed || len(res) != 1000 {
		t.Fatalf("1000 bytes within WithMaxResultBytes(1000): %d bytes, %v, %v", len(res), processed, err)
	}
	if res, _, err := b.store.ProcessResult(ctx, "big", sized(1000)); err != nil || len(res) != 1000 {
		t.Errorf("duplicate: %d bytes, %v; want the stored 1000", len(res), err)
	}
	_, _, err = b.store.ProcessResult(ctx, "small", sized(6), pgdedup.WithMaxResultBytes(5))
	if !errors.Is(err, pgdedup.ErrResultTooLarge) || !strings.Contains(err.Error(), "6 bytes, more than WithMaxResultBytes (5)") {
		t.Errorf("6 bytes with WithMaxResultBytes(5): %v", err)
	}
	for _, n := range []int{0, -1} {
		if _, _, err := b.store.ProcessResult(ctx, "bad", sized(1), pgdedup.WithMaxResultBytes(n)); !errors.Is(err, pgdedup.ErrInvalidOption) {
			t.Errorf("WithMaxResultBytes(%d): %v, want ErrInvalidOption", n, err)
		}
	}
	for _, id := range []string{"small", "bad"} {
		if recorded(t, b.pool, "billing", id) {
			t.Errorf("%s recorded", id)
		}
	}
	if n := chargesPerOrder(t, b.pool)["sized"]; n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
}

// A duplicate's row deleted between the claim and the read of its result
// (by Cleanup once expired, or Forget): ProcessResult claims the ID again,
// as the new ID it has become, runs fn and stores its answer. The gap is held
// open by a statement trigger after the claim's INSERT that waits for an
// advisory lock of the test's.
func TestProcessResultRowDeletedAfterClaim(t *testing.T) {
	t.Parallel()
	layouts := map[string]*bundle{"plain": nil, "partitioned": nil}
	for name := range layouts {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if pgtest.CitusColumn() != "" {
				return // Citus refuses triggers on a distributed table
			}
			var b *bundle
			if name == "plain" {
				b = setup(t, pgdedup.Config{})
			} else {
				b = setupPartitioned(t, pgdedup.Config{Retention: time.Hour})
			}
			ctx := ctxT(t)
			if res, processed, err := b.store.ProcessResult(ctx, "req-1", reply("req-1")); err != nil || !processed {
				t.Fatalf("first delivery: %q, %v, %v", res, processed, err)
			}
			mustExec(t, b.pool, `CREATE FUNCTION gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_advisory_xact_lock_shared(hashtext(current_schema())); RETURN NULL; END $$`)
			mustExec(t, b.pool, `CREATE TRIGGER gate AFTER INSERT ON processed_messages FOR EACH STATEMENT EXECUTE FUNCTION gate()`)
			gate, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer gate.Rollback(ctx)
			mustExec(t, gate, `SELECT pg_advisory_xact_lock(hashtext(current_schema()))`)

			pool, app := namedPool(t, b)
			dup, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
			if err != nil {
				t.Fatal(err)
			}
			type answer struct {
				res       []byte
				processed bool
				err       error
			}
			second := make(chan answer, 1)
			go func() {
				res, processed, err := dup.ProcessResult(ctx, "req-1", reply("req-1"))
				second <- answer{res, processed, err}
			}()
			waitForLockWait(t, b, app) // claimed: a duplicate, its result not read yet
			mustExec(t, b.pool, `DELETE FROM processed_messages WHERE message_id = 'req-1'`)
			if err := gate.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			a := receive(t, second, "the duplicate's answer")
			charges := chargesPerOrder(t, b.pool)["req-1"]
			if a.err != nil || !a.processed || string(a.res) == "" || charges != 2 {
				t.Fatalf("after its row was deleted: %q, processed=%v, err=%v, %d charges; want processed anew (2 charges in all)",
					a.res, a.processed, a.err, charges)
			}
			if again, processed, err := b.store.ProcessResult(ctx, "req-1", reply("req-1")); err != nil || processed || string(again) != string(a.res) {
				t.Errorf("a third delivery: %q, %v, %v; want the second answer %q", again, processed, err, a.res)
			}
		})
	}
}
