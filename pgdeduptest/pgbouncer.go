package pgdeduptest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
)

// PgBouncer reports whether the tests run behind PgBouncer in transaction
// pooling mode, as the environment variable TEST_PGBOUNCER (any non-empty value)
// says. It is explicit rather than detected so that a misconfigured run fails
// loudly instead of silently switching isolation methods.
//
// Behind PgBouncer a test cannot isolate itself with a search_path startup
// parameter. PgBouncer refuses unknown startup parameters, and dropping it with
// ignore_startup_parameters would put every test in the same schema. So each
// test's schema gets a login role of the same name, a superuser like the one in
// TEST_DATABASE_URL, whose default search_path (ALTER ROLE … SET search_path)
// is the schema, and DB.URL logs in as that role. PgBouncer must let such roles
// in without a reload (auth_type=trust with auth_user and auth_query, see
// .ci/services.sh), and TEST_DATABASE_URL should carry
// default_query_exec_mode=exec, since PgBouncer before 1.21 cannot keep
// prepared statements across transactions.
func PgBouncer() bool { return os.Getenv("TEST_PGBOUNCER") != "" }

// createSchema creates the test's schema and, behind PgBouncer, its role.
func createSchema(ctx context.Context, admin *pgx.Conn, schema string) error {
	stmts := []string{"CREATE SCHEMA " + schema}
	if PgBouncer() {
		stmts = []string{
			"CREATE ROLE " + schema + " LOGIN SUPERUSER",
			"CREATE SCHEMA " + schema + " AUTHORIZATION " + schema,
			"ALTER ROLE " + schema + " SET search_path = " + schema,
		}
	}
	return execAll(ctx, admin, stmts)
}

// dropSchema drops what createSchema created, and anything the test's role
// owns elsewhere in the database.
func dropSchema(ctx context.Context, admin *pgx.Conn, schema string) error {
	stmts := []string{"DROP SCHEMA " + schema + " CASCADE"}
	if PgBouncer() {
		stmts = append(stmts, "DROP OWNED BY "+schema+" CASCADE", "DROP ROLE "+schema)
	}
	return execAll(ctx, admin, stmts)
}

// schemaURL returns base changed to connect to schema, with its search_path
// or, behind PgBouncer, as the role of the same name.
func schemaURL(base, schema string) (string, error) {
	if PgBouncer() {
		return withUser(base, schema)
	}
	return WithSearchPath(base, schema)
}

// withUser returns the connection string u (URL or key=value form) logging in
// as user, without a password, because the test database trusts local
// connections.
func withUser(u, user string) (string, error) {
	if !strings.HasPrefix(u, "postgres://") && !strings.HasPrefix(u, "postgresql://") {
		return u + " user=" + user + " password=''", nil
	}
	parsed, err := url.Parse(u)
	if err != nil {
		return "", fmt.Errorf("pgdeduptest: parse database URL: %w", err)
	}
	parsed.User = url.User(user)
	return parsed.String(), nil
}

func execAll(ctx context.Context, conn *pgx.Conn, stmts []string) error {
	for _, sql := range stmts {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}
