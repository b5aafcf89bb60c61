package citusdist_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/citusdist"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// A table name may contain $, which must not end the DO block's quote early.
// The statements run as generated on a table named so, and re-key its primary
// key (on plain PostgreSQL, without the Citus call itself).
func TestDedupStatementsRunOnTableNamesWithDollars(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	for _, name := range []string{"x$$", "x$pgdedup$", "x$pgdedup$y$pgdedup1$"} {
		t.Run(name, func(t *testing.T) {
			pgtest.Exec(t, db.Pool, `CREATE TABLE `+pgx.Identifier{name}.Sanitize()+` (LIKE processed_messages INCLUDING ALL)`)
			stmts, err := citusdist.Dedup(citusdist.QuoteName(name), "message_id", 0, "")
			if err != nil {
				t.Fatal(err)
			}
			last := stmts[len(stmts)-1]
			if !strings.HasPrefix(last, "SELECT create_distributed_table(") {
				t.Fatalf("last statement: %s", last)
			}
			tx, err := db.Pool.Begin(ctx) // SET LOCAL needs one
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
			for _, q := range stmts[:len(stmts)-1] {
				if _, err := tx.Exec(ctx, q); err != nil {
					t.Fatalf("%v in\n%s", err, q)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			var pk string
			err = db.Pool.QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = to_regclass($1) AND contype = 'p'`, citusdist.QuoteName(name)).Scan(&pk)
			if err != nil || pk != "PRIMARY KEY (message_id, key)" {
				t.Errorf("primary key of %s: %q, %v", name, pk, err)
			}
		})
	}
}
