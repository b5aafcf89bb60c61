package cli_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// pgdedup setup moves a table that holds IDs and prints the switch time. Run
// again, it succeeds and changes nothing. The IDs stay.
func TestSetupCommandMovesPopulatedTable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pgtest.Seed(t, db.Pool, "billing", "b", 50, time.Hour)
	for range 2 {
		r := run(t, "setup", "--retention", "1h", "--partitions", "12", "--database-url", db.URL)
		if pgtest.CitusColumn() != "" {
			if r.code != 1 || !strings.Contains(r.stderr, "plain PostgreSQL only") {
				t.Fatalf("setup of a distributed table: %s, want a refusal", r)
			}
			return
		}
		if r.code != 0 || !strings.Contains(r.stdout, "is partitioned: ") || !strings.Contains(r.stdout, "until the switch at ") {
			t.Fatalf("setup: %s", r)
		}
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'billing'`); n != 50 {
		t.Errorf("%d IDs after the move, want 50", n)
	}
}

func TestSetupCommandRefusesTinySpans(t *testing.T) {
	t.Parallel()
	r := run(t, "setup", "--retention", "1s", "--partitions", "20", "--database-url", "postgres://nowhere.invalid/x")
	if r.code != 2 || !strings.Contains(r.stderr, "Partitions") || !strings.Contains(r.stderr, "shorter than") {
		t.Fatalf("setup with 50 ms partitions: %s, want a usage error", r)
	}
	r = run(t, "setup", "--retention", "336h", "--partitions", "336", "--database-url", "postgres://nowhere.invalid/x")
	if r.code != 2 || !strings.Contains(r.stderr, "Partitions") || !strings.Contains(r.stderr, "locks") {
		t.Fatalf("setup with 336 partitions: %s, want a usage error naming the lock cost", r)
	}
}
