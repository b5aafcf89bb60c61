package pgdeduptest

import (
	"testing"

	"github.com/jackc/pgx/v5"
)

// withUser must keep everything but the user, in both connection string forms,
// and drop the password, because test roles have none.
func TestWithUser(t *testing.T) {
	for _, base := range []string{
		"postgres://postgres:secret@127.0.0.1:6432/test?sslmode=disable&default_query_exec_mode=exec",
		"host=127.0.0.1 port=6432 user=postgres password=secret dbname=test sslmode=disable default_query_exec_mode=exec",
	} {
		u, err := withUser(base, "pgdedup_test_abc")
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := pgx.ParseConfig(u)
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		if cfg.User != "pgdedup_test_abc" || cfg.Password != "" || cfg.Database != "test" || cfg.Port != 6432 ||
			cfg.DefaultQueryExecMode != pgx.QueryExecModeExec {
			t.Errorf("withUser(%q) = %q: user %q, password %q, database %q, port %d, exec mode %v",
				base, u, cfg.User, cfg.Password, cfg.Database, cfg.Port, cfg.DefaultQueryExecMode)
		}
	}
}
