package cli

import (
	"context"
	"io/fs"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// What reverting each of pgdedup's migrations drops, as downDrops reads it
// from their Down sections. A new migration is read too, and one whose Down
// drops something in a form downDrops cannot read fails here.
func TestDownDropsOfEachMigration(t *testing.T) {
	type drops struct {
		losses []loss
		others []dropped
	}
	want := map[string]drops{
		"00001_processed_messages.sql":    {losses: []loss{{table: "processed_messages"}}},
		"00002_idempotency_responses.sql": {losses: []loss{{table: "processed_messages", columns: []string{"request_fingerprint", "response_status", "response_headers", "response_body"}}}},
		"00003_compact_key.sql": {
			losses: []loss{{table: "processed_messages", columns: []string{"key"}, derived: "computed from consumer and message_id"}},
			others: []dropped{
				{kind: "constraint", name: "processed_messages_pkey", table: "processed_messages", replaced: true},
				{kind: "trigger", name: "processed_messages_fill_key", table: "processed_messages"},
				{kind: "function", name: "pgdedup_fill_key()"},
				{kind: "function", name: "pgdedup_key(text, text)"},
			},
		},
		"00004_processed_offsets.sql":          {losses: []loss{{table: "processed_offsets"}}},
		"00005_function_search_path.sql":       {}, // its Down reverts nothing
		"00006_fingerprint_result.sql":         {losses: []loss{{table: "processed_messages", columns: []string{"fingerprint", "result"}}}},
		"00007_drop_idempotency_responses.sql": {}, // its Down adds 00002's columns back, empty
	}
	names, err := fs.Glob(pgdedup.Migrations(), "*.sql")
	if err != nil || len(names) == 0 {
		t.Fatal(names, err)
	}
	for _, name := range names {
		src, err := fs.ReadFile(pgdedup.Migrations(), name)
		if err != nil {
			t.Fatal(err)
		}
		losses, others, err := downDrops(string(src))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if w, ok := want[name]; ok && (!reflect.DeepEqual(losses, w.losses) || !reflect.DeepEqual(others, w.others)) {
			t.Errorf("%s drops %+v and %+v, want %+v and %+v", name, losses, others, w.losses, w.others)
		}
	}
}

func TestDownDropsForms(t *testing.T) {
	for _, tc := range []struct {
		down   string
		losses []loss
		others []dropped
		bad    bool
	}{
		{"DROP TABLE IF EXISTS a, ops.b CASCADE;", []loss{{table: "a"}, {table: "ops.b"}}, nil, false},
		{"drop table\n    t;", []loss{{table: "t"}}, nil, false},
		{"ALTER TABLE ONLY t DROP COLUMN IF EXISTS x, ADD COLUMN y numeric(10, 2), DROP z;", []loss{{table: "t", columns: []string{"x", "z"}}}, nil, false},
		{"ALTER TABLE t DROP CONSTRAINT t_pkey;", nil, []dropped{{kind: "constraint", name: "t_pkey", table: "t"}}, false},
		{"ALTER TABLE t ALTER COLUMN c DROP DEFAULT;", nil, nil, false},
		{"DROP INDEX i; DROP FUNCTION f(); DROP FUNCTION ops.g(text,int);", nil,
			[]dropped{{kind: "index", name: "i"}, {kind: "function", name: "f()"}, {kind: "function", name: "ops.g(text, int)"}}, false},
		{"CREATE INDEX tmp ON t (c);\nDROP INDEX IF EXISTS tmp;", nil, nil, false},
		{"DROP TRIGGER IF EXISTS tg ON t;", nil, []dropped{{kind: "trigger", name: "tg", table: "t"}}, false},
		// Inside a DO block, under a condition, and after a comment.
		{"-- +goose StatementBegin\nDO $$ BEGIN\n  IF true THEN -- why\n    DROP TABLE x;\n  END IF;\nEND $$;\n-- +goose StatementEnd", []loss{{table: "x"}}, nil, false},
		{"TRUNCATE t;", nil, nil, true},
		{"DELETE FROM t;", nil, nil, true},
		{"DROP VIEW v;", nil, nil, true},
		{"DROP SCHEMA s CASCADE;", nil, nil, true},
		{`DROP TABLE "odd name";`, nil, nil, true},
		{"-- +goose StatementBegin\nDO $$ BEGIN EXECUTE 'DROP TABLE t'; END $$;\n-- +goose StatementEnd", nil, nil, true},
	} {
		losses, others, err := downDrops("-- +goose Up\nSELECT 1;\n-- +goose Down\n" + tc.down + "\n")
		if (err != nil) != tc.bad || !reflect.DeepEqual(losses, tc.losses) || !reflect.DeepEqual(others, tc.others) {
			t.Errorf("%q: %+v, %+v, %v; want %+v, %+v (error: %v)", tc.down, losses, others, err, tc.losses, tc.others, tc.bad)
		}
	}
}

// schemaObjects lists the tables, columns, indexes, functions, triggers and
// constraints of the search_path's first schema (pgdedup's own version
// tables left out), each with its table ("" for a function) and, for a
// constraint, its definition.
func schemaObjects(t *testing.T, db *pgtest.DB) map[string][2]string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `
WITH tabs AS (
    SELECT c.oid, c.relname FROM pg_catalog.pg_class c
    WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
      AND c.relname NOT IN ('pgdedup_db_version', 'pgdedup_db_lock'))
SELECT 'table ' || relname, relname, '' FROM tabs
UNION ALL
SELECT 'column ' || t.relname || '.' || a.attname, t.relname, '' FROM tabs t
    JOIN pg_catalog.pg_attribute a ON a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'index ' || i.relname, t.relname, '' FROM tabs t
    JOIN pg_catalog.pg_index x ON x.indrelid = t.oid JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
UNION ALL
SELECT 'trigger ' || g.tgname || ' of ' || t.relname, t.relname, '' FROM tabs t
    JOIN pg_catalog.pg_trigger g ON g.tgrelid = t.oid AND NOT g.tgisinternal
UNION ALL
SELECT 'constraint ' || n.conname || ' of ' || t.relname, t.relname, pg_catalog.pg_get_constraintdef(n.oid) FROM tabs t
    JOIN pg_catalog.pg_constraint n ON n.conrelid = t.oid
UNION ALL
SELECT 'function ' || p.proname || '(' || pg_catalog.oidvectortypes(p.proargtypes) || ')', '', '' FROM pg_catalog.pg_proc p
    WHERE p.pronamespace = current_schema()::regnamespace`)
	if err != nil {
		t.Fatal(err)
	}
	objects := map[string][2]string{}
	for rows.Next() {
		var name, table, def string
		if err := rows.Scan(&name, &table, &def); err != nil {
			t.Fatal(err)
		}
		objects[name] = [2]string{table, def}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return objects
}

// Each of pgdedup's Down sections runs on a database, newest first, and what
// it removed from the schema is exactly what downDrops says, which is what
// `pgdedup migrate down` prints. That is a dropped table with its columns,
// indexes, triggers and constraints, dropped columns, indexes, functions and
// triggers, and constraints dropped (gone) or added again (redefined).
func TestDownDropsMatchTheSchema(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	p, err := pgdedup.NewMigrationProvider(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	sources := p.ListSources()
	for i := len(sources) - 1; i >= 0; i-- {
		name := sources[i].Path[strings.LastIndex(sources[i].Path, "/")+1:]
		src, err := fs.ReadFile(pgdedup.Migrations(), name)
		if err != nil {
			t.Fatal(err)
		}
		losses, others, err := downDrops(string(src))
		if err != nil {
			t.Fatal(err)
		}
		before := schemaObjects(t, db)
		if _, err := p.Down(ctx); err != nil {
			t.Fatalf("down %s: %v", name, err)
		}
		after := schemaObjects(t, db)

		var gone, redefined []string
		for o, v := range before {
			w, ok := after[o]
			switch {
			case !ok:
				gone = append(gone, o)
			case v[1] != w[1]:
				redefined = append(redefined, o)
			}
		}
		var wantGone, wantRedefined []string
		droppedTables := map[string]bool{}
		for _, l := range losses {
			if l.columns == nil {
				droppedTables[l.table] = true
				continue
			}
			for _, c := range l.columns {
				wantGone = append(wantGone, "column "+l.table+"."+c)
			}
		}
		for o, v := range before {
			if droppedTables[v[0]] {
				wantGone = append(wantGone, o)
			}
		}
		for _, d := range others {
			switch {
			case d.replaced:
				wantRedefined = append(wantRedefined, "constraint "+d.name+" of "+d.table)
			case d.table != "":
				wantGone = append(wantGone, d.kind+" "+d.name+" of "+d.table)
			default:
				wantGone = append(wantGone, d.kind+" "+d.name)
			}
		}
		slices.Sort(gone)
		slices.Sort(redefined)
		slices.Sort(wantGone)
		slices.Sort(wantRedefined)
		if !slices.Equal(gone, wantGone) || !slices.Equal(redefined, wantRedefined) {
			t.Errorf("down %s removed %q and redefined %q; its summary says %q and %q", name, gone, redefined, wantGone, wantRedefined)
		}
	}
}
