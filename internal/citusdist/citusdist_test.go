package citusdist

import (
	"strings"
	"testing"
)

// The statements differ by column as docs/citus.md says. By message_id the
// trigger is kept (unsafe triggers allowed) and the primary key re-keyed. By
// key the trigger is dropped. Anything else is refused before any SQL.
func TestDedupStatements(t *testing.T) {
	byID, err := Dedup(`"ops"."processed_messages"`, "message_id", 8, "")
	if err != nil {
		t.Fatal(err)
	}
	sql := strings.Join(byID, "\n")
	for _, want := range []string{"SET LOCAL citus.enable_unsafe_triggers = on;", "ADD PRIMARY KEY (message_id, key)",
		`SELECT create_distributed_table('"ops"."processed_messages"', 'message_id', shard_count => 8);`} {
		if !strings.Contains(sql, want) {
			t.Errorf("by message_id: no %q in\n%s", want, sql)
		}
	}
	if strings.Contains(sql, "DROP TRIGGER") {
		t.Errorf("by message_id drops the key trigger:\n%s", sql)
	}
	byKey, err := Dedup(`"processed_messages"`, "key", 0, "none")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(byKey, "\n"); got != `DROP TRIGGER IF EXISTS processed_messages_fill_key ON "processed_messages";
SELECT create_distributed_table('"processed_messages"', 'key', colocate_with => 'none');` {
		t.Errorf("by key:\n%s", got)
	}
	if _, err := Dedup(`"processed_messages"`, "consumer", 0, ""); err == nil {
		t.Error("by consumer: no error")
	}
	if got := Colocate(`"processed_messages"`, Colocated{Table: `"it's"`, Column: "message_id"}); got !=
		`SELECT create_distributed_table('"it''s"', 'message_id', colocate_with => '"processed_messages"');` {
		t.Errorf("Colocate = %s", got)
	}
	if got := QuoteName("ops.charges"); got != `"ops"."charges"` {
		t.Errorf("QuoteName = %s", got)
	}
}
