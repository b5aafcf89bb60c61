package migrate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// Errors that waiting cannot fix end the wait for the lock at once.
func TestLockRetryable(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{errors.New("failed to acquire lock"), true},
		{context.DeadlineExceeded, true},
		{&pgconn.PgError{Code: "40P01"}, true},  // deadlock_detected
		{&pgconn.PgError{Code: "57P01"}, true},  // admin_shutdown
		{&pgconn.PgError{Code: "42501"}, false}, // insufficient_privilege
		{&pgconn.PgError{Code: "42P01"}, false}, // undefined_table
		{&pgconn.PgError{Code: "3F000"}, false}, // invalid_schema_name
		{&pgconn.PgError{Code: "25006"}, false}, // read_only_sql_transaction
		{&pgconn.PgError{Code: "28000"}, false}, // invalid_authorization_specification
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "42501"}), false},
	}
	for _, c := range cases {
		if got := lockRetryable(c.err); got != c.want {
			t.Errorf("lockRetryable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// The error for a table made elsewhere wraps the sentinel and names the schema.
func TestMigratedElsewhere(t *testing.T) {
	sentinel := errors.New("made by another tool")
	m := Migrator{VersionTable: "v_table", ErrOtherTool: sentinel}
	err := m.migratedElsewhere("app")
	if !errors.Is(err, sentinel) {
		t.Fatalf("%v does not wrap the sentinel", err)
	}
	for _, want := range []string{"in schema app", "v_table"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}
