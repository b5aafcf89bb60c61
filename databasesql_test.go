package pgdedup_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// openSQL opens the test schema through pgx's stdlib driver, as a database/sql
// user would.
func openSQL(t *testing.T, b *bundle) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// chargeSQL claims id in a database/sql transaction and charges it when new.
func chargeSQL(ctx context.Context, db *sql.DB, store *pgdedup.Store, id string) (bool, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	claimed, err := store.ClaimSQL(ctx, tx, id)
	if err != nil || !claimed {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO charges (order_id) VALUES ($1)`, id); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

func TestClaimSQLChargesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	db, ctx := openSQL(t, b), ctxT(t)

	for i, want := range []bool{true, false, false} {
		got, err := chargeSQL(ctx, db, b.store, "order-1")
		if err != nil || got != want {
			t.Fatalf("delivery %d: claimed=%v err=%v, want %v", i+1, got, err, want)
		}
	}
	// A claim made over pgx is a duplicate over database/sql, and back.
	if _, err := b.store.Process(ctx, "order-2", charge("order-2")); err != nil {
		t.Fatal(err)
	}
	if got, err := chargeSQL(ctx, db, b.store, "order-2"); err != nil || got {
		t.Fatalf("order-2 over database/sql after pgx: claimed=%v err=%v", got, err)
	}
	if got := chargesPerOrder(t, b.pool); got["order-1"] != 1 || got["order-2"] != 1 || len(got) != 2 {
		t.Fatalf("charges per order = %v, want one each", got)
	}
}

func TestClaimSQLDuplicateLeavesTxUsableAndRollbackForgets(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	db, ctx := openSQL(t, b), ctxT(t)
	if _, err := chargeSQL(ctx, db, b.store, "done"); err != nil {
		t.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if claimed, err := b.store.ClaimSQL(ctx, tx, "done"); err != nil || claimed {
		t.Fatalf("duplicate: claimed=%v err=%v", claimed, err)
	}
	if claimed, err := b.store.ClaimSQL(ctx, tx, "rolled-back"); err != nil || !claimed {
		t.Fatalf("new ID after a duplicate in the same tx: claimed=%v err=%v", claimed, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if recorded(t, b.pool, "billing", "rolled-back") {
		t.Fatal("a claim in a rolled-back tx was recorded")
	}
	if got, err := chargeSQL(ctx, db, b.store, "rolled-back"); err != nil || !got {
		t.Fatalf("redelivery after rollback: claimed=%v err=%v, want processed", got, err)
	}
}

func TestClaimBatchSQL(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	db, ctx := openSQL(t, b), ctxT(t)
	if _, err := chargeSQL(ctx, db, b.store, "old"); err != nil {
		t.Fatal(err)
	}
	// IDs that an array literal could misread if not quoted and escaped.
	ids := []string{`z`, `a"b`, `old`, `c\d`, `{e,f}`, `NULL`, ` spaced `, `ünï`, `z`, `a"b`, `''`}
	want := []string{`z`, `a"b`, `c\d`, `{e,f}`, `NULL`, ` spaced `, `ünï`, `''`}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	fresh, err := b.store.ClaimBatchSQL(ctx, tx, ids)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fresh, want) {
		t.Fatalf("fresh = %q, want %q", fresh, want)
	}
	again, err := b.store.ClaimBatchSQL(ctx, tx, ids)
	if err != nil || len(again) != 0 {
		t.Fatalf("same batch again in the tx: fresh=%q err=%v", again, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, id := range want {
		if !recorded(t, b.pool, "billing", id) {
			t.Errorf("%q not recorded", id)
		}
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != len(want)+1 {
		t.Fatalf("%d rows recorded, want %d", n, len(want)+1)
	}
}

func TestClaimSQLRejectsBadInputBeforeTheDatabase(t *testing.T) {
	t.Parallel()
	store, ctx := setup(t, pgdedup.Config{}).store, ctxT(t)
	// A nil tx would fail on first use, so these errors prove nothing was sent.
	if _, err := store.ClaimSQL(ctx, nil, ""); !errors.Is(err, pgdedup.ErrInvalidMessageID) {
		t.Fatalf("empty ID: %v", err)
	}
	if _, err := store.ClaimBatchSQL(ctx, nil, []string{"ok", "bad\x00"}); !errors.Is(err, pgdedup.ErrInvalidMessageID) ||
		!strings.Contains(err.Error(), "message 1 of 2") {
		t.Fatalf("batch with a NUL: %v", err)
	}
	if fresh, err := store.ClaimBatchSQL(ctx, nil, nil); err != nil || fresh != nil {
		t.Fatalf("empty batch: %q %v", fresh, err)
	}
	if _, err := store.ClaimSQL(ctx, nil, "ok"); err == nil {
		t.Fatal("nil tx: no error")
	}
}

func TestClaimSQLLockTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{LockTimeout: 50 * time.Millisecond})
	db, ctx := openSQL(t, b), ctxT(t)

	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback() //nolint:errcheck
	if claimed, err := b.store.ClaimSQL(ctx, holder, "busy"); err != nil || !claimed {
		t.Fatalf("holder: claimed=%v err=%v", claimed, err)
	}

	// The claim of a free ID leaves the transaction's own lock_timeout as it was.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.ExecContext(ctx, `SET LOCAL lock_timeout = '7s'`); err != nil {
		t.Fatal(err)
	}
	if fresh, err := b.store.ClaimBatchSQL(ctx, tx, []string{"free-1", "free-2"}); err != nil || len(fresh) != 2 {
		t.Fatalf("free batch: %q %v", fresh, err)
	}
	var lt string
	if err := tx.QueryRowContext(ctx, `SHOW lock_timeout`).Scan(&lt); err != nil || lt != "7s" {
		t.Fatalf("lock_timeout after the claim = %q (%v), want the caller's 7s", lt, err)
	}

	// With the caller's lock_timeout off, only the Store's LockTimeout can end
	// the wait: without it the claim would wait for the holder, which never
	// ends, until ctx gives up with another error.
	if _, err := tx.ExecContext(ctx, `SET LOCAL lock_timeout = 0`); err != nil {
		t.Fatal(err)
	}
	_, err = b.store.ClaimSQL(ctx, tx, "busy")
	if !errors.Is(err, pgdedup.ErrInFlight) {
		t.Fatalf("claim of an ID held elsewhere: %v, want ErrInFlight", err)
	}

	tx2, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback() //nolint:errcheck
	if _, err := b.store.ClaimBatchSQL(ctx, tx2, []string{"x", "busy"}); !errors.Is(err, pgdedup.ErrInFlight) {
		t.Fatalf("batch with an ID held elsewhere: %v, want ErrInFlight", err)
	}
}

func TestClaimSQLWaitsForTheHolder(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	db, ctx := openSQL(t, b), ctxT(t)

	for _, commit := range []bool{true, false} {
		id := map[bool]string{true: "committed", false: "rolled-back"}[commit]
		holder, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if claimed, err := b.store.ClaimSQL(ctx, holder, id); err != nil || !claimed {
			t.Fatalf("holder: claimed=%v err=%v", claimed, err)
		}
		type result struct {
			claimed bool
			err     error
		}
		done := make(chan result, 1)
		go func() {
			got, err := chargeSQL(ctx, db, b.store, id)
			done <- result{got, err}
		}()
		select {
		case r := <-done:
			t.Fatalf("second claim did not wait for the holder: %+v", r)
		case <-time.After(100 * time.Millisecond):
		}
		if commit {
			err = holder.Commit()
		} else {
			err = holder.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		if r := <-done; r.err != nil || r.claimed == commit {
			t.Fatalf("holder commit=%v: waiting claim got claimed=%v err=%v", commit, r.claimed, r.err)
		}
	}
	if got := chargesPerOrder(t, b.pool); got["rolled-back"] != 1 || got["committed"] != 0 {
		t.Fatalf("charges = %v, want only the rolled-back holder's ID charged by the waiter", got)
	}
}
