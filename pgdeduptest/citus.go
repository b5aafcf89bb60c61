package pgdeduptest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/citusdist"
)

// With TEST_CITUS_DISTRIBUTE set to a column of processed_messages (message_id
// or key, see internal/citusdist),
// TEST_DATABASE_URL is taken to be a Citus coordinator. New distributes each
// test's processed_messages by that column after migrating it, and Distribute
// distributes the business tables the tests create, so the whole suite runs
// against distributed tables. TEST_CITUS_SHARDS sets citus.shard_count for
// them (Citus's default, 32, when unset). Each test's processed_messages has
// a co-location group of its own, with its business tables. Citus locks a
// table of the group while it distributes another into it, which would tie
// one test's sealing (or a dropped schema) to another's setup.

// CitusColumn returns the distribution column of processed_messages named by
// TEST_CITUS_DISTRIBUTE, or "" when tests run on plain PostgreSQL.
func CitusColumn() string { return os.Getenv("TEST_CITUS_DISTRIBUTE") }

// Distribute makes table (in db's schema) a hash-distributed Citus table on
// column, co-located with processed_messages when colocate is set, if the
// suite runs on Citus (CitusColumn). Otherwise it does nothing. Call it right
// after creating the table, before writing to it.
func (db *DB) Distribute(t testing.TB, table, column string, colocate bool) {
	t.Helper()
	if CitusColumn() == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, db.base)
	if err != nil {
		t.Fatalf("pgdeduptest: connect: %v", err)
	}
	defer admin.Close(ctx)
	if err := distribute(ctx, admin, db.Schema, table, column, colocate); err != nil {
		t.Fatalf("pgdeduptest: distribute %s.%s by %s: %v", db.Schema, table, column, err)
	}
}

func distribute(ctx context.Context, admin *pgx.Conn, schema, table, column string, colocate bool) error {
	tx, err := admin.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	if n := os.Getenv("TEST_CITUS_SHARDS"); n != "" {
		if _, err := strconv.Atoi(n); err != nil {
			return fmt.Errorf("TEST_CITUS_SHARDS=%q is not a number", n)
		}
		if _, err := tx.Exec(ctx, "SET LOCAL citus.shard_count = "+n); err != nil {
			return err
		}
	}
	name := pgx.Identifier{schema, table}.Sanitize()
	var stmts []string
	switch {
	case table == "processed_messages": // the documented way, as pgdedup citus distribute does it
		if stmts, err = citusdist.Dedup(name, column, 0, "none"); err != nil {
			return err
		}
	case colocate:
		stmts = []string{citusdist.Colocate(pgx.Identifier{schema, "processed_messages"}.Sanitize(), citusdist.Colocated{Table: name, Column: column})}
	default:
		stmts = []string{fmt.Sprintf("SELECT create_distributed_table('%s', '%s')", name, column)}
	}
	for _, q := range stmts {
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return tx.Commit(ctx)
}
