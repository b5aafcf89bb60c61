// Package citusdist writes the SQL that distributes pgdedup's table over a
// Citus cluster, shared by `pgdedup citus distribute`, the tests' harness
// (internal/pgtest) and the bench, so that all of them distribute the table
// the one documented way (docs/citus.md).
package citusdist

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Columns are the columns the dedup table can be distributed by.
//
// message_id (the default) co-locates the claim with business rows keyed by the
// message ID, and puts the claims of every consumer of one message on one
// shard. Citus requires the distribution column in the primary key, so the
// primary key becomes (message_id, key). It is unique exactly when key is,
// because key is a function of consumer and message_id. key co-locates it with
// business rows that store pgdedup.Key(consumer, id), and keeps the primary key
// as it is.
var Columns = []string{"message_id", "key"}

// Colocated is a business table to distribute by Column, co-located with the
// dedup table. Column holds what the dedup table's distribution column holds.
type Colocated struct {
	Table  string // quoted, possibly schema-qualified
	Column string // unquoted
}

// Dedup returns the statements that distribute the dedup table (quoted,
// possibly schema-qualified) by column, with shards shards. Zero shards means
// the cluster's citus.shard_count. The table is co-located as colocateWith
// says. An empty colocateWith leaves it to Citus, which picks the default
// group of its column type and shard count, the group that holds the business
// tables distributed the same way. "none" gives it a group of its own. Run the
// statements in one transaction on the coordinator, before consumers start,
// and then Colocate's for the business tables. They are plain SQL, for --sql.
//
// The insert trigger of migration 00003 fills key for writers that predate
// it (and for raw SQL that leaves key out). By message_id it is kept, and
// citus.enable_unsafe_triggers lets Citus create it on every shard, where it
// computes the row's key from the row alone. By key it is dropped, because
// Citus routes an insert by its key before any trigger could fill it. Every
// writer must then pass the key, as every Store does.
func Dedup(table, column string, shards int, colocateWith string) ([]string, error) {
	if column != "message_id" && column != "key" {
		return nil, fmt.Errorf("cannot distribute by %q: want message_id or key", column)
	}
	lit := quoteLiteral(table)
	var stmts []string
	if column == "key" {
		stmts = append(stmts, fmt.Sprintf("DROP TRIGGER IF EXISTS processed_messages_fill_key ON %s;", table))
	} else {
		// The primary key must contain the distribution column, so (key)
		// becomes (message_id, key). A table still keyed by (consumer,
		// message_id) contains it already.
		body := fmt.Sprintf(`
DECLARE pk name;
BEGIN
    SELECT conname INTO pk FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'
        AND pg_get_constraintdef(oid) = 'PRIMARY KEY (key)';
    IF pk IS NOT NULL THEN
        EXECUTE format('ALTER TABLE %%s DROP CONSTRAINT %%I, ADD PRIMARY KEY (message_id, key)', %s, pk);
    END IF;
END
`, lit, lit)
		stmts = append(stmts, "SET LOCAL citus.enable_unsafe_triggers = on;", "DO "+dollarQuote(body)+";")
	}
	opts := ""
	if shards > 0 {
		opts = fmt.Sprintf(", shard_count => %d", shards)
	}
	if colocateWith != "" {
		opts += ", colocate_with => " + quoteLiteral(colocateWith)
	}
	return append(stmts, fmt.Sprintf("SELECT create_distributed_table(%s, '%s'%s);", lit, column, opts)), nil
}

// Colocate returns the statement that distributes business table c
// co-located with the dedup table (quoted, possibly schema-qualified).
func Colocate(dedup string, c Colocated) string {
	return fmt.Sprintf("SELECT create_distributed_table(%s, %s, colocate_with => %s);",
		quoteLiteral(c.Table), quoteLiteral(c.Column), quoteLiteral(dedup))
}

// QuoteName quotes "schema.table" or "table", each part a plain identifier
// the caller has checked.
func QuoteName(name string) string { return pgx.Identifier(strings.Split(name, ".")).Sanitize() }

// dollarQuote quotes body as a dollar-quoted string whose tag body does not
// contain. A table name may contain $ ("x$$"), which would end a plain $$
// quote early.
func dollarQuote(body string) string {
	tag := "$pgdedup$"
	for i := 1; strings.Contains(body, tag); i++ {
		tag = fmt.Sprintf("$pgdedup%d$", i)
	}
	return tag + body + tag
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
