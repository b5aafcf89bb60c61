package main

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// setup returns a schema migrated for pgdedup and River (with goose) holding
// the orders table.
func setup(t *testing.T) *pgtest.DB {
	t.Helper()
	db := pgtest.New(t) // pgdedup migrated: migrate finds nothing to do for it
	if err := migrate(context.Background(), stdlib.OpenDBFromPool(db.Pool)); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, db.Pool, schema)
	return db
}

// A commit enqueues exactly its order's job, a duplicate enqueues nothing, a
// rollback enqueues nothing.
func TestJobsFollowTheTransaction(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	client, err := newRiver(db.Pool, "", false)
	if err != nil {
		t.Fatal(err)
	}
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	jobs := func(order string) int {
		return pgtest.Count(t, db.Pool, `SELECT count(*) FROM river_job WHERE kind = 'confirm_order' AND args->>'order_id' = $1`, order)
	}
	one := Order{OrderID: "o-1", AmountCents: 500}
	for i, want := range []bool{true, false} { // the second is a duplicate
		if processed, err := store.Process(ctx, one.OrderID, handle(client, one)); err != nil || processed != want {
			t.Fatalf("delivery %d: processed %v, %v", i+1, processed, err)
		}
		if n := jobs("o-1"); n != 1 {
			t.Fatalf("after delivery %d: %d jobs for o-1, want 1", i+1, n)
		}
	}

	two := Order{OrderID: "o-2", AmountCents: 700}
	boom := errors.New("fraud check unavailable")
	_, err = store.Process(ctx, two.OrderID, func(ctx context.Context, tx pgx.Tx) error {
		if err := handle(client, two)(ctx, tx); err != nil {
			return err
		}
		return boom // after the job's InsertTx
	})
	if !errors.Is(err, boom) || jobs("o-2") != 0 {
		t.Fatalf("rolled back: %v, %d jobs for o-2; want the error and none", err, jobs("o-2"))
	}
	if processed, err := store.Process(ctx, two.OrderID, handle(client, two)); !processed || err != nil || jobs("o-2") != 1 {
		t.Fatalf("redelivered: %v, %v, %d jobs", processed, err, jobs("o-2"))
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM river_job`); n != 2 {
		t.Fatalf("%d jobs in all, want 2", n)
	}
}

// goose applied River's versions and pgdedup's, each in its own version
// table, and River's own bookkeeping agrees; a River version goes down and
// up again through goose.
func TestMigrationsWithGoose(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	p, err := riverMigrations(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	status, err := p.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	latest := int64(len(status))
	if v, err := p.GetDBVersion(ctx); err != nil || v != latest || latest < 6 {
		t.Fatalf("River's goose version %d (%v), want all %d", v, err, latest)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM river_migration`); int64(n) != latest {
		t.Fatalf("river_migration records %d versions, goose %d", n, latest)
	}
	pd, err := pgdedup.NewMigrationProvider(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	if pending, err := pd.HasPending(ctx); err != nil || pending {
		t.Fatalf("pgdedup migrations pending: %v %v", pending, err)
	}
	if _, err := p.Down(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM river_migration`); int64(n) != latest-1 {
		t.Fatalf("after goose down: river_migration records %d versions, want %d", n, latest-1)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if v, _ := p.GetDBVersion(ctx); v != latest {
		t.Fatalf("after goose up: version %d, want %d", v, latest)
	}
}
