package citus_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/placement/citus"
	"github.com/pgdedup/pgdedup/internal/shape/plain"
)

// On a Citus table, the internal error XX000 a coordinator session fails
// with once after a worker crashed ("failure on connection marked as
// essential") is transient: Process retries it and a consumer requeues. On
// plain PostgreSQL XX000 is an internal error like any other, not retried.
func TestCitusInternalErrorIsTransient(t *testing.T) {
	essential := fmt.Errorf("pgdedup: claim %q: %w", "m1",
		&pgconn.PgError{Code: "XX000", Message: "failure on connection marked as essential: 127.0.0.1:9701"})
	if !pgdedup.IsTransient(citus.Placement(0).Transient(essential)) {
		t.Error("XX000 on Citus is not transient")
	}
	if pgdedup.IsTransient(plain.Placement(0).Transient(essential)) {
		t.Error("XX000 on plain PostgreSQL is transient")
	}
	if err := citus.Placement(0).Transient(essential); !errors.Is(err, essential) || err.Error() != essential.Error() {
		t.Errorf("marked error %v does not wrap the original unchanged", err)
	}
	unique := &pgconn.PgError{Code: "23505"}
	if pgdedup.IsTransient(citus.Placement(0).Transient(unique)) {
		t.Error("a unique violation on Citus is transient")
	}
}
