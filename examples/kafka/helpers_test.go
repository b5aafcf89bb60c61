package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/pgdedup/pgdedup/pgdeduptest"
)

func countCharged(t *testing.T, db *pgdeduptest.DB) int {
	t.Helper()
	return pgdeduptest.Count(t, db.Pool, "SELECT count(DISTINCT order_id) FROM charges")
}

// checkCharges asserts that charges holds exactly one row per order of want,
// with its customer and amount, and nothing else.
func checkCharges(t *testing.T, db *pgdeduptest.DB, want map[string]Order) {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), "SELECT order_id, customer, amount_cents, count(*) OVER (PARTITION BY order_id) FROM charges")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := map[string]bool{}
	var bad []string
	for rows.Next() {
		var o Order
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
			bad = append(bad, fmt.Sprintf("order %s charged as %+v, produced as %+v", o.OrderID, o, w))
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
}
