package fleet

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// ShopDB returns a database of the test's own (see [pgdeduptest.New]) with
// the shop's tables beside pgdedup's: what a consumer of the examples charges
// into.
func ShopDB(t *testing.T) *pgdeduptest.DB {
	t.Helper()
	db := pgdeduptest.New(t)
	if err := shop.Migrate(context.Background(), db.Pool); err != nil {
		t.Fatal(err)
	}
	return db
}

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

// CheckCharges asserts that charges holds exactly one row per order of want
// ([CheckOneChargePerOrder]), and that pgdedup recorded one message ID per
// order.
func CheckCharges(t *testing.T, db *pgdeduptest.DB, want map[string]shop.Order) {
	t.Helper()
	CheckOneChargePerOrder(t, db, want)
	var ids int
	if err := db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM processed_messages WHERE consumer = 'billing'").Scan(&ids); err != nil {
		t.Fatal(err)
	}
	if ids != len(want) {
		t.Errorf("processed_messages holds %d IDs for billing, want one per order: %d", ids, len(want))
	}
}

// CheckOneChargePerOrder asserts that charges holds exactly one row per order
// of want, with its customer and amount, and nothing else.
func CheckOneChargePerOrder(t *testing.T, db *pgdeduptest.DB, want map[string]shop.Order) {
	t.Helper()
	ctx := context.Background()
	rows, err := db.Pool.Query(ctx, "SELECT order_id, customer, amount_cents, count(*) OVER (PARTITION BY order_id) FROM charges")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
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
			bad = append(bad, fmt.Sprintf("order %s charged as %+v, sent as %+v", o.OrderID, o, w))
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

// HoldCharge claims id for the billing consumer ([pgdeduptest.HoldClaim]) and
// charges o as by, in a transaction it leaves open: a first delivery still
// running on another consumer. The test commits or rolls it back; it is
// rolled back when the test ends otherwise.
func HoldCharge(t *testing.T, ctx context.Context, db *pgdeduptest.DB, id string, o shop.Order, by string) pgx.Tx {
	t.Helper()
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	tx := pgdeduptest.HoldClaim(t, db.Pool, store, id)
	if err := shop.Charge(ctx, tx, o, id, by); err != nil {
		t.Fatal(err)
	}
	return tx
}

// CheckChargedBy asserts that charges holds exactly want: for each order, who
// charged it, once per charge.
func CheckChargedBy(t *testing.T, db *pgdeduptest.DB, want map[string][]string) {
	t.Helper()
	rows, _ := db.Pool.Query(context.Background(), "SELECT order_id, charged_by FROM charges ORDER BY id")
	got := map[string][]string{}
	type row struct{ Order, By string }
	all, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		got[r.Order] = append(got[r.Order], r.By)
	}
	if len(got) != len(want) {
		t.Fatalf("charges %v, want %v", got, want)
	}
	for o, by := range want {
		if !slices.Equal(got[o], by) {
			t.Fatalf("charges %v, want %v", got, want)
		}
	}
}
