package cli

import (
	"io/fs"
	"reflect"
	"testing"

	"github.com/pgdedup/pgdedup"
)

// What reverting each of pgdedup's migrations drops, as downLosses reads it
// from their Down sections. A new migration is read too: one whose Down
// drops something in a form downLosses cannot read fails here.
func TestDownLossesOfEachMigration(t *testing.T) {
	want := map[string][]loss{
		"00001_processed_messages.sql":    {{table: "processed_messages"}},
		"00002_idempotency_responses.sql": {{table: "processed_messages", columns: []string{"request_fingerprint", "response_status", "response_headers", "response_body"}}},
		"00003_compact_key.sql":           nil, // key is computed from consumer and message_id: nothing is lost
		"00004_processed_offsets.sql":     {{table: "processed_offsets"}},
		"00005_function_search_path.sql":  nil, // its Down reverts nothing
		"00006_fingerprint_result.sql":    {{table: "processed_messages", columns: []string{"fingerprint", "result"}}},
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
		got, err := downLosses(string(src))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if w, ok := want[name]; ok && !reflect.DeepEqual(got, w) {
			t.Errorf("%s drops %+v, want %+v", name, got, w)
		}
	}
}

func TestDownLossesForms(t *testing.T) {
	for _, tc := range []struct {
		down string
		want []loss
		bad  bool
	}{
		{"DROP TABLE IF EXISTS a, ops.b CASCADE;", []loss{{table: "a"}, {table: "ops.b"}}, false},
		{"drop table\n    t;", []loss{{table: "t"}}, false},
		{"ALTER TABLE ONLY t DROP COLUMN IF EXISTS x, ADD COLUMN y int, DROP z;", []loss{{table: "t", columns: []string{"x", "z"}}}, false},
		{"ALTER TABLE t DROP CONSTRAINT t_pkey;", nil, false},
		{"DROP INDEX i; DROP FUNCTION f();", nil, false},
		{"-- +goose StatementBegin\nDO $$ BEGIN DROP TABLE x; END $$;\n-- +goose StatementEnd", nil, false},
		{"TRUNCATE t;", nil, true},
		{"DELETE FROM t;", nil, true},
		{`DROP TABLE "odd name";`, nil, true},
	} {
		got, err := downLosses("-- +goose Up\nSELECT 1;\n-- +goose Down\n" + tc.down + "\n")
		if (err != nil) != tc.bad || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: %+v, %v; want %+v (error: %v)", tc.down, got, err, tc.want, tc.bad)
		}
	}
}
