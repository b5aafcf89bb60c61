package pgdedup_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// runtimeGrants are the README's GRANTs for a service's runtime role, which
// never runs migrations: SELECT, INSERT and DELETE, nothing more.
var runtimeGrants = []string{
	`GRANT SELECT, INSERT, DELETE ON processed_messages TO %s`,
}

// A role holding only the README's GRANTs (and the business table's own) runs
// everything a service does at runtime: Process, ProcessBatch, Claim,
// ClaimBatch, Cleanup, with LockTimeout set. It cannot change the schema or the
// recorded IDs.
func TestLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	pool, role := rolePool(t, b, runtimeGrants...)
	var user string
	var super bool
	if err := pool.QueryRow(ctx, `SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&user, &super); err != nil {
		t.Fatal(err)
	}
	if user != role || super {
		t.Fatalf("connected as %q (superuser %v), want the unprivileged %q", user, super, role)
	}

	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		processed, err := store.Process(ctx, "m1", charge("o1"))
		if err != nil || processed != want {
			t.Fatalf("Process #%d: processed=%v err=%v, want %v, nil", i+1, processed, err, want)
		}
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if claimed, err := store.Claim(ctx, tx, "m2"); err != nil || !claimed {
			t.Errorf("Claim m2: claimed=%v err=%v, want true, nil", claimed, err)
		}
		fresh, err := store.ClaimBatch(ctx, tx, []string{"m1", "m3", "m2", "m4", "m3"})
		if err != nil || !slices.Equal(fresh, []string{"m3", "m4"}) {
			t.Errorf("ClaimBatch: fresh=%q err=%v, want [m3 m4], nil", fresh, err)
		}
		return charge("o2")(ctx, tx)
	})
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := store.ProcessBatch(ctx, []string{"m4", "m5"}, func(ctx context.Context, tx pgx.Tx, fresh []string) error {
		return charge("o5")(ctx, tx)
	})
	if err != nil || !slices.Equal(fresh, []string{"m5"}) {
		t.Fatalf("ProcessBatch: fresh=%q err=%v, want [m5], nil", fresh, err)
	}

	// Rows of another consumer that have already expired; Cleanup deletes
	// exactly those.
	short, err := pgdedup.New(pool, pgdedup.Config{Consumer: "short", Retention: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := short.ProcessBatch(ctx, []string{"e1", "e2"}, func(context.Context, pgx.Tx, []string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond)
	if n, err := store.Cleanup(ctx); err != nil || n != 2 {
		t.Fatalf("Cleanup: deleted=%d err=%v, want 2, nil", n, err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'billing'`); n != 5 {
		t.Fatalf("%d billing IDs recorded, want 5 (m1..m5)", n)
	}
	if got := chargesPerOrder(t, b.pool); got["o1"] != 1 || got["o2"] != 1 || got["o5"] != 1 || len(got) != 3 {
		t.Fatalf("charges per order %v, want o1, o2, o5 once each", got)
	}

	for _, sql := range []string{
		`CREATE TABLE evil (id int)`,
		`CREATE INDEX evil ON processed_messages (processed_at)`,
		`ALTER TABLE processed_messages ADD COLUMN evil int`,
		`DROP TABLE processed_messages`,
		`TRUNCATE processed_messages`,
		`UPDATE processed_messages SET message_id = 'forged'`,
		`UPDATE processed_messages SET expires_at = 'infinity'`,
		`CREATE TABLE public.evil (id int)`,
	} {
		_, err := pool.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		// Citus refuses to change a distribution column before checking privileges.
		refused := errors.As(err, &pgErr) && (pgErr.Code == "42501" ||
			pgErr.Code == "0A000" && pgtest.CitusColumn() == "message_id" && strings.Contains(sql, "SET message_id"))
		if !refused {
			t.Errorf("%s as the runtime role: err=%v, want insufficient_privilege (42501)", sql, err)
		}
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE message_id = 'forged'`); n != 0 {
		t.Fatalf("runtime role rewrote %d message IDs", n)
	}
}

// A consumer role without DELETE (cleanup left to another role) still
// processes messages, and cannot erase what it recorded: a compromised consumer
// cannot make a processed message new again.
func TestConsumerRoleWithoutDeleteCannotForget(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	pool, _ := rolePool(t, b, `GRANT SELECT, INSERT ON processed_messages TO %s`)
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", Retention: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := store.ProcessBatch(ctx, []string{"m1", "m2"}, func(ctx context.Context, tx pgx.Tx, _ []string) error {
		return charge("o1")(ctx, tx)
	})
	if err != nil || len(fresh) != 2 {
		t.Fatalf("ProcessBatch: fresh=%q err=%v, want [m1 m2], nil", fresh, err)
	}
	time.Sleep(time.Millisecond)
	for _, sql := range []string{`DELETE FROM processed_messages`, `TRUNCATE processed_messages`} {
		_, err := pool.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s: err=%v, want insufficient_privilege (42501)", sql, err)
		}
	}
	if _, err := store.Cleanup(ctx); err == nil {
		t.Error("Cleanup without DELETE succeeded")
	}
	if !recorded(t, b.pool, "billing", "m1") || !recorded(t, b.pool, "billing", "m2") {
		t.Fatal("the consumer role erased recorded IDs")
	}
	if processed, err := store.Process(ctx, "m1", charge("o1")); err != nil || processed {
		t.Fatalf("m1 again: processed=%v err=%v, want a duplicate", processed, err)
	}
}
