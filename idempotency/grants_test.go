package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// The column-level grants of docs/operations.md, role by role. %s is
// the role.
var (
	consumerGrants = []string{`GRANT INSERT, SELECT (message_id) ON processed_messages TO %s`}
	cleanerGrants  = []string{`GRANT SELECT (ctid, expires_at), DELETE ON processed_messages TO %s`}
	httpGrants     = []string{
		`GRANT INSERT, SELECT (key, consumer, message_id, expires_at, fingerprint, result) ON processed_messages TO %s`,
		`GRANT UPDATE (result) ON processed_messages TO %s`,
	}
)

// grantedPool returns a pool logging in as a new role that holds grants (and
// what the charges table needs).
func grantedPool(t *testing.T, db *pgtest.DB, grants []string) *pgxpool.Pool {
	t.Helper()
	role, url := db.NewRole(t)
	for _, g := range append(slices.Clone(grants), `GRANT SELECT, INSERT ON charges TO %s`, `GRANT USAGE ON SEQUENCE charges_id_seq TO %s`) {
		pgtest.Exec(t, db.Pool, fmt.Sprintf(g, role))
	}
	return pgtest.Pool(t, url, 4)
}

func denied(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// Each role works with only its column-level grants: a message consumer
// (INSERT, SELECT(message_id)) processes and claims, singly and in batches; a
// cleaner (SELECT(ctid, expires_at), DELETE) deletes expired rows; the HTTP
// middleware's role stores and replays answers. A consumer role cannot read
// the stored responses of HTTP keys.
func TestColumnGrantsPerRole(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	ctx := context.Background()
	insert := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO charges (order_id, amount) VALUES ('o', 1)`)
		return err
	}

	// The middleware, as its role.
	web := grantedPool(t, b.db, httpGrants)
	w := setupOn(t, b.db, web, idempotency.Config{}, nil)
	first := post(t, w.url, "k", order)
	if first.status != 201 {
		t.Fatalf("as the HTTP role: %v", first)
	}
	if r := post(t, w.url, "k", order); r.body != first.body || !r.replayed() {
		t.Fatalf("replay as the HTTP role: %v", r)
	}
	if r := post(t, w.url, "k", `{"order":"x","amount":1}`); !isProblem(r, 422) {
		t.Fatalf("another request as the HTTP role: %v", r)
	}

	// A message consumer.
	consumer := grantedPool(t, b.db, consumerGrants)
	store, err := pgdedup.New(consumer, pgdedup.Config{Consumer: "billing", LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		if processed, err := store.Process(ctx, "m1", insert); err != nil || processed != want {
			t.Fatalf("Process #%d as the consumer role: %v, %v", i+1, processed, err)
		}
	}
	fresh, err := store.ProcessBatch(ctx, []string{"m1", "m2", "m3"}, func(ctx context.Context, tx pgx.Tx, _ []string) error { return insert(ctx, tx) })
	if err != nil || !slices.Equal(fresh, []string{"m2", "m3"}) {
		t.Fatalf("ProcessBatch as the consumer role: %q, %v", fresh, err)
	}
	err = pgx.BeginFunc(ctx, consumer, func(tx pgx.Tx) error {
		if ok, err := store.Claim(ctx, tx, "m4"); err != nil || !ok {
			return fmt.Errorf("Claim: %v, %w", ok, err)
		}
		if got, err := store.ClaimBatch(ctx, tx, []string{"m4", "m5"}); err != nil || !slices.Equal(got, []string{"m5"}) {
			return fmt.Errorf("ClaimBatch: %q, %w", got, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("as the consumer role: %v", err)
	}
	for _, sql := range []string{
		`SELECT result FROM processed_messages`,
		`SELECT fingerprint FROM processed_messages`,
		`UPDATE processed_messages SET result = 'forged'`,
		`DELETE FROM processed_messages`,
	} {
		if _, err := consumer.Exec(ctx, sql); !denied(err) {
			t.Errorf("%s as the consumer role: %v, want insufficient_privilege", sql, err)
		}
	}

	// A cleaner, once the consumer's rows have expired.
	if _, err := b.pool.Exec(ctx, `UPDATE processed_messages SET expires_at = now() - interval '1 second' WHERE consumer = 'billing'`); err != nil {
		t.Fatal(err)
	}
	cleaner := grantedPool(t, b.db, cleanerGrants)
	cs, err := pgdedup.New(cleaner, pgdedup.Config{Consumer: "cleaner"})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := cs.Cleanup(ctx); err != nil || n != 5 {
		t.Fatalf("Cleanup as the cleaner role: deleted %d, %v; want 5", n, err)
	}
	for _, col := range []string{"result", "fingerprint"} {
		if _, err := cleaner.Exec(ctx, `SELECT `+col+` FROM processed_messages`); !denied(err) {
			t.Errorf("the cleaner read %s: %v", col, err)
		}
	}
	if n := keys(t, b.pool); n != 1 {
		t.Fatalf("%d rows left, want the HTTP key", n)
	}
}
