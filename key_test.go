package pgdedup_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
)

// The key is part of the on-disk format: it must never change. This value is
// SHA-256("billing\x00order-1")'s first 16 bytes, computed independently.
func TestKeyIsStable(t *testing.T) {
	t.Parallel()
	if got, want := pgdedup.Key("billing", "order-1"), "6a4c5c6d-d5c8-489d-1422-999764c15c8a"; got != want {
		t.Fatalf("Key = %s, want %s", got, want)
	}
	if pgdedup.Key("a", "bc") == pgdedup.Key("ab", "c") {
		t.Fatal("the 0 byte between consumer and ID does not separate them")
	}
}

// Go and SQL compute the same key, whatever the bytes of the ID.
func TestKeyMatchesSQL(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	pairs := [][2]string{
		{"billing", "order-1"},
		{"ünïcødé", "日本語-🙂"},
		{"c", `quote' "double" back\slash {brace,comma}`},
		{"c", strings.Repeat("x", pgdedup.MaxMessageIDLen)},
		{"c", "line\nbreak\ttab"},
	}
	for _, p := range pairs {
		var sqlKey string
		if err := b.pool.QueryRow(ctx, `SELECT pgdedup_key($1, $2)::text`, p[0], p[1]).Scan(&sqlKey); err != nil {
			t.Fatal(err)
		}
		if goKey := pgdedup.Key(p[0], p[1]); goKey != sqlKey {
			t.Errorf("Key(%q, %q) = %s in Go, %s in SQL", p[0], p[1][:min(len(p[1]), 20)], goKey, sqlKey)
		}
	}
}

// Rows inserted without key (code that predates migration 00003, raw SQL) get
// it from the trigger, so they are duplicates for Claim and found by key.
func TestInsertWithoutKey(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	mustExec(t, b.pool, `INSERT INTO processed_messages (consumer, message_id, expires_at)
VALUES ('billing', 'old-code', now() + interval '1 hour') ON CONFLICT DO NOTHING`)
	var id string
	if err := b.pool.QueryRow(ctx, `SELECT message_id FROM processed_messages WHERE key = $1`,
		pgdedup.Key("billing", "old-code")).Scan(&id); err != nil || id != "old-code" {
		t.Fatalf("row by key: %q, %v", id, err)
	}
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		claimed, err := b.store.Claim(ctx, tx, "old-code")
		if err == nil && claimed {
			t.Error("an ID inserted without key was claimed again")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// And the other way round: what Claim recorded, an insert without key skips.
	if _, err := b.store.Process(ctx, "new-code", charge("o1")); err != nil {
		t.Fatal(err)
	}
	tag, err := b.pool.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, expires_at)
VALUES ('billing', 'new-code', now()) ON CONFLICT DO NOTHING`)
	if err != nil || tag.RowsAffected() != 0 {
		t.Fatalf("insert without key of a claimed ID: %v rows, %v", tag.RowsAffected(), err)
	}
}
