package pgdeduptest_test

import (
	"testing"

	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// New gives a subtest a migrated schema of its own, which is gone when the
// subtest ends.
func TestNewGivesAMigratedSchemaDroppedAtTheEnd(t *testing.T) {
	var schema string
	t.Run("inner", func(t *testing.T) {
		db := pgdeduptest.New(t)
		schema = db.Schema
		if n := pgdeduptest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages`); n != 0 {
			t.Fatalf("%d rows in a fresh schema", n)
		}
		if n := pgdeduptest.Count(t, db.Pool, `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`); n < 1 {
			t.Fatalf("current schema %s has no tables", schema)
		}
	})
	admin := pgdeduptest.NewUnmigrated(t)
	if n := pgdeduptest.Count(t, admin.Pool, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema); n != 0 {
		t.Fatalf("schema %s still exists after its test", schema)
	}
}
