package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

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
