package pgdedup_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

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

func TestConsumersAreIndependent(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{Consumer: "billing"})
	ctx := ctxT(t)
	emails, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "emails"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*pgdedup.Store{b.store, emails, b.store, emails} {
		if _, err := s.Process(ctx, "msg-1", charge("order-"+s.Consumer())); err != nil {
			t.Fatal(err)
		}
	}
	got := chargesPerOrder(t, b.pool)
	if got["order-billing"] != 1 || got["order-emails"] != 1 {
		t.Fatalf("charges %v, want one per consumer", got)
	}
}

var (
	_ pgdedup.DB = (*pgxpool.Pool)(nil)
	_ pgdedup.DB = (*pgx.Conn)(nil)
)

// New rejects a bad Config before touching the database with a *ConfigError
// naming the field, and Validate says the same without a database. Table
// names come from configuration, which an attacker may influence: anything but
// plain identifiers is refused, so nothing can reach the SQL text. Consumer
// names that Postgres text cannot hold are refused like IDs, but as a Config
// error. Zero values are not errors: they take the defaults.
func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	type bad struct {
		cfg   pgdedup.Config
		field string
	}
	cases := map[string]bad{
		"no consumer":            {pgdedup.Config{}, "Consumer"},
		"consumer NUL":           {pgdedup.Config{Consumer: "a\x00b"}, "Consumer"},
		"consumer not UTF-8":     {pgdedup.Config{Consumer: "\xff\xfe"}, "Consumer"},
		"consumer truncated":     {pgdedup.Config{Consumer: "caf\xc3"}, "Consumer"},
		"offset table":           {pgdedup.Config{Consumer: "c", OffsetTable: "a.b.c"}, "OffsetTable"},
		"negative retention":     {pgdedup.Config{Consumer: "c", Retention: -time.Hour}, "Retention"},
		"negative lock timeout":  {pgdedup.Config{Consumer: "c", LockTimeout: -time.Second}, "LockTimeout"},
		"negative attempts":      {pgdedup.Config{Consumer: "c", MaxAttempts: -1}, "MaxAttempts"},
		"negative cleanup batch": {pgdedup.Config{Consumer: "c", CleanupBatchSize: -5}, "CleanupBatchSize"},
		"read-only transactions": {pgdedup.Config{Consumer: "c", TxOptions: pgx.TxOptions{AccessMode: pgx.ReadOnly}}, "TxOptions"},
	}
	for _, table := range []string{
		`processed_messages; DROP TABLE charges`,
		`processed_messages"; DROP TABLE charges; --`,
		`"processed_messages"`,
		`x"y`,
		`processed_messages--`,
		`processed messages`,
		`a.b.c`,
		`.processed_messages`,
		`processed_messages.`,
		`public.`,
		`1processed_messages`,
		`processed_messages/**/`,
		"processed_messages\x00",
		"processed_messages\n",
		`pröcessed_messages`,
		strings.Repeat("t", 64),
	} {
		cases["table "+table] = bad{pgdedup.Config{Consumer: "c", Table: table}, "Table"}
	}
	for name, c := range cases {
		store, err := pgdedup.New(b.pool, c.cfg)
		var ce *pgdedup.ConfigError
		if store != nil || !errors.As(err, &ce) || ce.Field != c.field || !strings.HasPrefix(err.Error(), "pgdedup: Config."+c.field+" ") {
			t.Errorf("%q: New returned %v, want a ConfigError for %s", name, err, c.field)
		}
		if errors.Is(err, pgdedup.ErrInvalidMessageID) {
			t.Errorf("%q: New returned %v, want a Config error, not ErrInvalidMessageID", name, err)
		}
		if verr := c.cfg.Validate(); verr == nil || verr.Error() != fmt.Sprint(err) {
			t.Errorf("%q: Validate returned %v, New %v", name, verr, err)
		}
	}
	if err := (pgdedup.Config{Consumer: "c"}).Validate(); err != nil {
		t.Errorf("the zero values of a Config with a consumer: %v", err)
	}
	if _, err := pgdedup.New(nil, pgdedup.Config{Consumer: "c"}); err == nil {
		t.Error("New accepted a nil DB")
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM charges`); n != 0 {
		t.Fatal("charges touched")
	}
}

func TestSchemaQualifiedTable(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	store, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "billing", Table: b.db.Schema + ".processed_messages"})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := store.Process(ctx, "m", charge("m")); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if !recorded(t, b.pool, "billing", "m") {
		t.Fatal("not recorded in the qualified table")
	}
}
