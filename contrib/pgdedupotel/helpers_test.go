package pgdedupotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// setup returns a migrated schema with a charges table, and a Store on it.
func setup(t *testing.T, cfg pgdedup.Config) (*pgxpool.Pool, *pgdedup.Store) {
	t.Helper()
	db := pgdeduptest.New(t)
	pgdeduptest.Exec(t, db.Pool, `CREATE TABLE charges (id bigserial PRIMARY KEY, order_id text NOT NULL)`)
	store, err := pgdedup.New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return db.Pool, store
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// charge is the business write, one charges row per order.
func charge(id string) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO charges (order_id) VALUES ($1)`, id)
		return err
	}
}

func chargeBatch(ctx context.Context, tx pgx.Tx, fresh []string) error {
	_, err := tx.Exec(ctx, `INSERT INTO charges (order_id) SELECT unnest($1::text[])`, fresh)
	return err
}

// failOnce makes fn's transaction fail its first attempt with a
// serialization failure, which Process retries.
func failOnce(fn func(context.Context, pgx.Tx) error) func(context.Context, pgx.Tx) error {
	failed := false
	return func(ctx context.Context, tx pgx.Tx) error {
		if !failed {
			failed = true
			_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001'; END $$`)
			return err
		}
		return fn(ctx, tx)
	}
}
