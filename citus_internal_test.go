package pgdedup

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// On a Citus table, the internal error XX000 a coordinator session fails
// with once after a worker crashed ("failure on connection marked as
// essential") is transient: Process retries it and a consumer requeues. On
// plain PostgreSQL XX000 is an internal error like any other, not retried.
func TestCitusInternalErrorIsTransient(t *testing.T) {
	essential := fmt.Errorf("pgdedup: claim %q: %w", "m1",
		&pgconn.PgError{Code: "XX000", Message: "failure on connection marked as essential: 127.0.0.1:9701"})
	if !IsTransient(citusPlacement(0).transient(essential)) {
		t.Error("XX000 on Citus is not transient")
	}
	if IsTransient(plainPlacement(0).transient(essential)) {
		t.Error("XX000 on plain PostgreSQL is transient")
	}
	if err := citusPlacement(0).transient(essential); !errors.Is(err, essential) || err.Error() != essential.Error() {
		t.Errorf("marked error %v does not wrap the original unchanged", err)
	}
	unique := &pgconn.PgError{Code: "23505"}
	if IsTransient(citusPlacement(0).transient(unique)) {
		t.Error("a unique violation on Citus is transient")
	}
}
