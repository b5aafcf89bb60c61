package pgtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/pgserver"
)

// CountBy runs sql, a query of (text, integer) rows such as
// SELECT k, count(*) … GROUP BY k, and returns them as a map; it fails t if
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

// Seed inserts n rows into processed_messages for consumer, IDs
// SeedID(prefix, 1) … SeedID(prefix, n), in one statement, processed two days
// ago. They expire about expiresIn from now() (negative: already expired), a
// microsecond apart and at most expiresIn, so that the order Cleanup takes
// them in is not arbitrary. IDs and expiry both ascend, which keeps the
// inserts at the right edge of both indexes, and the seeding fast.
func Seed(t testing.TB, db Querier, consumer, prefix string, n int, expiresIn time.Duration) {
	t.Helper()
	Exec(t, db, `INSERT INTO processed_messages (consumer, message_id, processed_at, expires_at)
SELECT $1, $2 || lpad(g::text, 7, '0'), now() - interval '2 days', now() + ($4::bigint - $3 + g) * interval '1 microsecond'
FROM generate_series(1, $3::int) g`, consumer, prefix, n, expiresIn.Microseconds())
}

// SeedID is the i-th message ID Seed inserts with prefix.
func SeedID(prefix string, i int) string { return fmt.Sprintf("%s%07d", prefix, i) }

// FanOut runs f(0) … f(n-1) concurrently, waits for them all, and fails t
// with every error they returned.
func FanOut(t testing.TB, n int, f func(i int) error) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = f(i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
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
