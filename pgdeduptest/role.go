package pgdeduptest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// NewRole creates a login role for t that may do nothing but use db's schema
// (USAGE on it, no privileges on any table, not a superuser), with db.Schema as
// its default search_path, and returns its name and a URL logging in as it,
// through PgBouncer too. The test grants it what it needs. The role is dropped,
// with its grants, when t ends. Close anything connected as it before.
//
// The search_path is the role's default rather than a URL parameter so that
// the same URL works directly and behind PgBouncer, the way a production
// runtime role would be set up.
func (db *DB) NewRole(t testing.TB) (name, url string) {
	t.Helper()
	name = "pgdedup_role_" + randomHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, db.base)
	if err != nil {
		t.Fatalf("pgdeduptest: connect: %v", err)
	}
	defer admin.Close(ctx)
	err = execAll(ctx, admin, []string{
		"CREATE ROLE " + name + " LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE",
		"GRANT USAGE ON SCHEMA " + db.Schema + " TO " + name,
		"ALTER ROLE " + name + " SET search_path = " + db.Schema,
	})
	if err != nil {
		t.Fatalf("pgdeduptest: create role: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, db.base)
		if err != nil {
			t.Errorf("pgdeduptest: drop role %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if err := execAll(ctx, conn, []string{"DROP OWNED BY " + name, "DROP ROLE " + name}); err != nil {
			t.Errorf("pgdeduptest: drop role %s: %v", name, err)
		}
	})
	url, err = withUser(db.base, name)
	if err != nil {
		t.Fatal(err)
	}
	return name, url
}
