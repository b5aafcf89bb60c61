package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdedup/pgdedup/internal/pgserver"
)

// Querier is what the helpers need from the database: a pool, a connection
// or a transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
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
// that integer; it fails t if the query errs.
func Count(t testing.TB, db Querier, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// StartCluster starts a throwaway PostgreSQL cluster of t's own (see
// [pgserver.StartCluster]), stopped and removed when t ends.
func StartCluster(t testing.TB) *pgserver.Cluster {
	t.Helper()
	c, err := pgserver.StartCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("pgtest: stop cluster: %v", err)
		}
	})
	return c
}
