package pgdedup_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// keyCheck is the opt-in constraint of docs/operations.md (threat model),
// as written there.
const keyCheck = `ALTER TABLE processed_messages ADD CONSTRAINT key_matches CHECK (key = pgdedup_key(consumer, message_id)) NOT VALID`

// With the documented CHECK, every way pgdedup claims still works, and so
// does a raw insert that leaves key to the trigger; a row whose key belongs
// to another ID, which a role with INSERT could otherwise write, is refused.
func TestKeyCheckConstraintRefusesForgedKeys(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	pgtest.Exec(t, db.Pool, keyCheck)
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context, pgx.Tx) error { return nil }
	if ok, err := store.Process(ctx, "m1", noop); err != nil || !ok {
		t.Fatalf("Process: %v, %v", ok, err)
	}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		fresh, err := store.ClaimBatch(ctx, tx, []string{"m2", "m3", "m1"})
		if err == nil && !slices.Equal(fresh, []string{"m2", "m3"}) {
			t.Errorf("ClaimBatch: fresh %q, want [m2 m3]", fresh)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, db.Pool, `INSERT INTO processed_messages (consumer, message_id, expires_at) VALUES ('billing', 'm4', now() + interval '1 hour')`)

	_, err = db.Pool.Exec(ctx, `INSERT INTO processed_messages (key, consumer, message_id, expires_at)
VALUES (pgdedup_key('billing', 'm6'), 'billing', 'm5', now() + interval '1 hour')`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
		t.Fatalf("a row keyed for another ID: %v, want a check violation (23514)", err)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages`); n != 4 {
		t.Fatalf("%d rows, want m1 to m4", n)
	}
}
