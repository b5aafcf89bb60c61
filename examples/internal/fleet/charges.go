package fleet

import (
	"context"
	"fmt"
	"testing"

	"github.com/pgdedup/pgdedup/examples/internal/shop"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// CountCharged is how many distinct orders charges holds.
func CountCharged(t *testing.T, db *pgdeduptest.DB) int {
	t.Helper()
	return pgdeduptest.Count(t, db.Pool, "SELECT count(DISTINCT order_id) FROM charges")
}

// CountRolledBack is how many charge INSERTs were rolled back: sequence values
// are not given back on rollback, so each leaves a gap in charges.id.
func CountRolledBack(t *testing.T, db *pgdeduptest.DB) int {
	t.Helper()
	return pgdeduptest.Count(t, db.Pool, "SELECT coalesce(max(id), 0) - count(*) FROM charges")
}

// CheckCharges asserts that charges holds exactly one row per order of want,
// with its customer and amount, and nothing else, and that pgdedup recorded
// one message ID per order.
func CheckCharges(t *testing.T, db *pgdeduptest.DB, want map[string]shop.Order) {
	t.Helper()
	ctx := context.Background()
	rows, err := db.Pool.Query(ctx, "SELECT order_id, customer, amount_cents, count(*) OVER (PARTITION BY order_id) FROM charges")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var bad []string
	for rows.Next() {
		var o shop.Order
		var n int
		if err := rows.Scan(&o.OrderID, &o.Customer, &o.AmountCents, &n); err != nil {
			t.Fatal(err)
		}
		switch w, ok := want[o.OrderID]; {
		case !ok:
			bad = append(bad, fmt.Sprintf("charged unknown order %+v", o))
		case n != 1 && !seen[o.OrderID]:
			bad = append(bad, fmt.Sprintf("order %s charged %d times", o.OrderID, n))
		case o != w:
			bad = append(bad, fmt.Sprintf("order %s charged as %+v, published as %+v", o.OrderID, o, w))
		}
		seen[o.OrderID] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id := range want {
		if !seen[id] {
			bad = append(bad, fmt.Sprintf("order %s never charged", id))
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d problems in charges, first ones: %v", len(bad), bad[:min(len(bad), 10)])
	}
	var ids int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM processed_messages WHERE consumer = 'billing'").Scan(&ids); err != nil {
		t.Fatal(err)
	}
	if ids != len(want) {
		t.Errorf("processed_messages holds %d IDs for billing, want one per order: %d", ids, len(want))
	}
}
