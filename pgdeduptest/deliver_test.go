package pgdeduptest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// kitBundle is a migrated schema with a charges table, a Store on it, and the
// test's own count of an order's charges.
type kitBundle struct {
	db    *pgdeduptest.DB
	store *pgdedup.Store
}

func newKitBundle(t *testing.T) *kitBundle {
	t.Helper()
	db := pgdeduptest.New(t)
	pgdeduptest.Exec(t, db.Pool, `CREATE TABLE charges (id bigserial PRIMARY KEY, order_id text NOT NULL)`)
	db.Distribute(t, "charges", "id", false)
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	return &kitBundle{db: db, store: store}
}

func (b *kitBundle) charges(orderID string) func(ctx context.Context) (int, error) {
	return func(ctx context.Context) (n int, err error) {
		err = b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM charges WHERE order_id = $1`, orderID).Scan(&n)
		return n, err
	}
}

// charge writes in tx, so the effect commits with the claim or not at all.
func charge(orderID string) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO charges (order_id) VALUES ($1)`, orderID)
		return err
	}
}

func TestDeliverHelpersPassAHandlerThatWritesInTx(t *testing.T) {
	t.Parallel()
	b := newKitBundle(t)
	if n := pgdeduptest.DeliverSequentially(t, b.store, "o-1", 3, charge("o-1")); n != 1 {
		t.Errorf("sequential: processed %d times", n)
	}
	pgdeduptest.AssertOnce(t, b.charges("o-1"))
	if n := pgdeduptest.DeliverConcurrently(t, b.store, "o-2", 8, charge("o-2")); n != 1 {
		t.Errorf("concurrent: processed %d times", n)
	}
	pgdeduptest.AssertOnce(t, b.charges("o-2"))
	if n := pgdeduptest.DeliverCutBeforeCommit(t, b.store, "o-3", charge("o-3")); n != 1 {
		t.Errorf("cut: processed %d times", n)
	}
	pgdeduptest.AssertOnce(t, b.charges("o-3"))
	// With one attempt, Process returns the cut's error and the redelivery
	// processes the message.
	once, err := pgdedup.New(b.db.Pool, pgdedup.Config{Consumer: "billing", MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	pgdeduptest.DeliverCutBeforeCommit(t, once, "o-4", charge("o-4"))
	pgdeduptest.AssertOnce(t, b.charges("o-4"))
}

// recorder is a TB that keeps the failures it is told of.
type recorder struct{ failures []string }

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, a ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, a...))
}
func (r *recorder) Fatalf(format string, a ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, a...))
}

// A handler that writes outside the claim's transaction (here on the pool)
// keeps its effect when the transaction is cut, and the redelivery repeats
// it. The kit reports it.
func TestDeliverHelpersCatchAHandlerThatWritesOutsideTx(t *testing.T) {
	t.Parallel()
	b := newKitBundle(t)
	outside := func(ctx context.Context, _ pgx.Tx) error {
		_, err := b.db.Pool.Exec(ctx, `INSERT INTO charges (order_id) VALUES ('o-1')`)
		return err
	}
	r := &recorder{}
	pgdeduptest.DeliverCutBeforeCommit(r, b.store, "o-1", outside)
	pgdeduptest.AssertOnce(r, b.charges("o-1"))
	if len(r.failures) != 1 || !strings.Contains(r.failures[0], "the effect happened 2 times, want once") {
		t.Errorf("failures reported: %q; want AssertOnce's", r.failures)
	}
}
