package pgdedup_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// Table names come from configuration, which an attacker may influence: New
// refuses anything but plain identifiers, so nothing can reach the SQL text.
func TestNewRejectsInjectedTableNames(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	for _, table := range []string{
		`processed_messages; DROP TABLE charges`,
		`processed_messages"; DROP TABLE charges; --`,
		`"processed_messages"`,
		`processed_messages--`,
		`processed messages`,
		`a.b.c`,
		`.processed_messages`,
		`processed_messages.`,
		`1processed_messages`,
		`processed_messages/**/`,
		"processed_messages\x00",
		"processed_messages\n",
		`pröcessed_messages`,
		strings.Repeat("a", 64),
	} {
		store, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "billing", Table: table})
		if err == nil || store != nil {
			t.Errorf("New with Table %q: err=%v, want an error", table, err)
		}
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM charges`); n != 0 {
		t.Fatalf("charges has %d rows, want the table intact and empty", n)
	}
}

// Accepted table names are quoted, so case is kept and a name that looks like
// SQL is only ever a name.
func TestTableNamesAreQuoted(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	mustExec(t, b.pool, `CREATE TABLE "Select$" (LIKE processed_messages INCLUDING ALL)`)
	for _, table := range []string{"Select$", b.db.Schema + ".Select$"} {
		store, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "billing", Table: table})
		if err != nil {
			t.Fatalf("New with Table %q: %v", table, err)
		}
		if _, err := store.Process(ctx, "m-"+table, charge("o")); err != nil {
			t.Fatalf("Process with Table %q: %v", table, err)
		}
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM "Select$"`); n != 2 {
		t.Fatalf(`"Select$" has %d rows, want 2`, n)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatalf("processed_messages has %d rows, want 0", n)
	}
}

// Consumer names and message IDs are bound parameters: SQL in them is stored
// byte for byte, harms nothing, and matches no other consumer's rows.
func TestConsumerAndIDsAreNotSQL(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	if _, err := b.store.Process(ctx, "m1", charge("o-billing")); err != nil {
		t.Fatal(err)
	}
	hostile := []string{
		`x'); DROP TABLE charges; --`,
		`billing' OR '1'='1`,
		`billing'--`,
		`"; DROP SCHEMA public CASCADE; --`,
		`$1`,
		`\'; DELETE FROM processed_messages; --`,
		`E'\x27'`,
		"billing\u2019 OR 1=1",
	}
	for _, consumer := range hostile {
		store, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: consumer})
		if err != nil {
			t.Fatalf("New with Consumer %q: %v", consumer, err)
		}
		for _, id := range append([]string{"m1"}, hostile...) {
			processed, err := store.Process(ctx, id, charge("o-hostile"))
			if err != nil || !processed {
				t.Fatalf("consumer %q, ID %q: processed=%v err=%v, want true, nil", consumer, id, processed, err)
			}
			if !recorded(t, b.pool, consumer, id) {
				t.Fatalf("consumer %q, ID %q not recorded verbatim", consumer, id)
			}
		}
	}
	want := len(hostile) * (len(hostile) + 1)
	if got := chargesPerOrder(t, b.pool); got["o-hostile"] != want || got["o-billing"] != 1 {
		t.Fatalf("charges per order %v, want o-hostile %d times and o-billing once", got, want)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != want+1 {
		t.Fatalf("%d IDs recorded, want %d", n, want+1)
	}
	if _, err := b.store.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != want+1 {
		t.Fatalf("Cleanup left %d IDs of unexpired %d", n, want+1)
	}
}

// Consumer names that Postgres text cannot hold are refused by New, like IDs.
func TestNewRejectsUnstorableConsumers(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	for _, consumer := range []string{"a\x00b", "\xff\xfe", "caf\xc3"} {
		if _, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: consumer}); err == nil {
			t.Errorf("New with Consumer %q: no error", consumer)
		} else if errors.Is(err, pgdedup.ErrInvalidMessageID) {
			t.Errorf("New with Consumer %q: %v, want a Config error, not ErrInvalidMessageID", consumer, err)
		}
	}
}
