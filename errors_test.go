package pgdedup

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// withDetail adds DETAIL and HINT to the message, once, and keeps the
// *pgconn.PgError reachable; errors without them are returned as they are.
func TestWithDetail(t *testing.T) {
	t.Parallel()
	refused := &pgconn.PgError{Severity: "ERROR", Code: "0A000", Message: "cannot run it",
		Detail: "the table is distributed", Hint: "use the coordinator"}
	plain := &pgconn.PgError{Severity: "ERROR", Code: "23505", Message: "duplicate key"}
	other := errors.New("boom")
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"not a PgError", other, "boom"},
		{"no detail or hint", plain, plain.Error()},
		{"detail and hint", fmt.Errorf("claim: %w", refused),
			"claim: " + refused.Error() + "; DETAIL: the table is distributed; HINT: use the coordinator"},
		{"already added", withDetail(refused), refused.Error() + "; DETAIL: the table is distributed; HINT: use the coordinator"},
	} {
		got := withDetail(c.err)
		if c.err == nil {
			if got != nil {
				t.Errorf("%s: %v, want nil", c.name, got)
			}
			continue
		}
		if got.Error() != c.want {
			t.Errorf("%s: %q, want %q", c.name, got.Error(), c.want)
		}
		var pgErr *pgconn.PgError
		if errors.As(c.err, &pgErr) && !errors.As(got, &pgErr) {
			t.Errorf("%s: the *pgconn.PgError is no longer reachable", c.name)
		}
	}
}
