package pgdeduptest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdedup/pgdedup"
)

// Querier is what test code needs from the database, such as a pool, a
// connection or a transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Exec runs sql and fails t if it errs.
func Exec(t testing.TB, db Querier, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// Count runs sql, a query of one integer such as SELECT count(*), and returns
// that integer. It fails t if the query errs.
func Count(t testing.TB, db Querier, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// CountBy runs sql, a query of (text, integer) rows such as
// SELECT k, count(*) … GROUP BY k, and returns them as a map. It fails t if
// the query errs.
func CountBy(t testing.TB, db Querier, sql string, args ...any) map[string]int {
	t.Helper()
	rows, err := db.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	out := map[string]int{}
	var k string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&k, &n}, func() error { out[k] = n; return nil }); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return out
}

// HoldClaim claims id with store in a transaction of its own on db and
// leaves that transaction open, so that a claim of id elsewhere waits for it
// (or, with [pgdedup.Config.LockTimeout], fails with [pgdedup.ErrInFlight]).
// The caller commits or rolls it back, and it is rolled back when t ends.
func HoldClaim(t testing.TB, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, store *pgdedup.Store, id string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if claimed, err := store.Claim(ctx, tx, id); err != nil || !claimed {
		t.Fatalf("pgdeduptest: holding the claim of %s: claimed=%v err=%v", id, claimed, err)
	}
	return tx
}
