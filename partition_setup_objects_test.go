package pgdedup_test

import (
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

// Row-level security and column grants survive Setup's table swap, on an
// empty table and through the online move: a role granted SELECT on two
// columns, under a policy that shows it only billing's IDs, reads those
// columns of billing's rows after Setup, and nothing else.
func TestSetupKeepsRowSecurityAndColumnGrants(t *testing.T) {
	t.Parallel()
	for _, move := range []bool{false, true} {
		t.Run(map[bool]string{false: "empty", true: "move"}[move], func(t *testing.T) {
			t.Parallel()
			b := setup(t, pgdedup.Config{})
			part := moveStore(t, b, pgdedup.Config{Layout: pgdedup.LayoutPartitioned, Retention: time.Hour}, 0, 0)
			if move && refusedOnCitus(t, b, part) {
				return
			}
			reader, role := rolePool(t, b, `GRANT SELECT (consumer, message_id) ON processed_messages TO %s`)
			mustExec(t, b.pool, `ALTER TABLE processed_messages ENABLE ROW LEVEL SECURITY`)
			mustExec(t, b.pool, `CREATE POLICY billing_only ON processed_messages FOR SELECT TO `+role+` USING (consumer = 'billing')`)
			ctx := ctxT(t)
			other, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "other", Layout: pgdedup.LayoutPartitioned, Retention: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if move {
				populate(t, b, b.store, 2)
				otherPlain, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "other", Retention: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := otherPlain.Process(ctx, "o-before", charge("o")); err != nil {
					t.Fatal(err)
				}
			}
			if err := part.Setup(ctx); err != nil {
				t.Fatal(err)
			}
			if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_class WHERE oid = 'processed_messages'::regclass AND relkind = 'p'`); n != 1 {
				t.Fatal("processed_messages is not partitioned after Setup")
			}
			for _, id := range []string{"b-after"} {
				if _, err := part.Process(ctx, id, charge(id)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := other.Process(ctx, "o-after", charge("o")); err != nil {
				t.Fatal(err)
			}
			rows, _ := reader.Query(ctx, `SELECT message_id FROM processed_messages ORDER BY 1`)
			ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
			want := []string{"b-after"}
			if move {
				want = []string{"b-after", "pre-0", "pre-1"}
			}
			if err != nil || !slices.Equal(ids, want) {
				t.Errorf("the role reads %v (%v), want billing's IDs only: %v", ids, err, want)
			}
			var pgErr *pgconn.PgError
			if _, err := reader.Exec(ctx, `SELECT expires_at FROM processed_messages`); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
				t.Errorf("the role reads a column it was not granted: %v, want permission denied", err)
			}
		})
	}
}

// A trigger of the user's own on the plain table is refused by name, and
// the table is left as it was, plain, with the trigger.
func TestSetupRefusesTriggers(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	mustExec(t, b.pool, `CREATE FUNCTION audit_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`)
	// (Citus allows a trigger on a distributed table only when told to.)
	err := pgx.BeginFunc(ctxT(t), b.pool, func(tx pgx.Tx) error {
		if pgtest.CitusColumn() != "" {
			mustExec(t, tx, `SET LOCAL citus.enable_unsafe_triggers = on`)
		}
		_, err := tx.Exec(ctxT(t), `CREATE TRIGGER audit_claims AFTER INSERT ON processed_messages FOR EACH ROW EXECUTE FUNCTION audit_claim()`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	part := moveStore(t, b, pgdedup.Config{Layout: pgdedup.LayoutPartitioned, Retention: time.Hour}, 0, 0)
	err = part.Setup(ctxT(t))
	if err == nil || !strings.Contains(err.Error(), "audit_claims") {
		t.Fatalf("Setup of a table with a trigger of its own: %v, want an error naming it", err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_class c JOIN pg_trigger g ON g.tgrelid = c.oid
WHERE c.oid = 'processed_messages'::regclass AND c.relkind = 'r' AND g.tgname = 'audit_claims'`); n != 1 {
		t.Error("the table is no longer plain with its trigger")
	}
}
