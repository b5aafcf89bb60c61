package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
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
		"blank consumer":         {pgdedup.Config{Consumer: " "}, "Consumer"},
		"consumer of tabs":       {pgdedup.Config{Consumer: "\t\n"}, "Consumer"},
		"consumer with escape":   {pgdedup.Config{Consumer: "bill\x1b[31ming"}, "Consumer"},
		"consumer of 10 MiB":     {pgdedup.Config{Consumer: strings.Repeat("c", 10<<20)}, "Consumer"},
		"consumer over the max":  {pgdedup.Config{Consumer: strings.Repeat("c", pgdedup.MaxConsumerLen+1)}, "Consumer"},
		"retention of 48ns":      {pgdedup.Config{Consumer: "c", Retention: 48}, "Retention"},
		"retention under 1s":     {pgdedup.Config{Consumer: "c", Retention: pgdedup.MinRetention - 1}, "Retention"},
		"negative max batch":     {pgdedup.Config{Consumer: "c", MaxBatch: -1}, "MaxBatch"},
		"partitions over the max": {pgdedup.Config{Consumer: "c", Layout: pgdedup.LayoutPartitioned, Retention: 14 * 24 * time.Hour,
			Partitions: pgdedup.MaxPartitions + 1}, "Partitions"},
		"negative runway":         {pgdedup.Config{Consumer: "c", Runway: -time.Hour}, "Runway"},
		"runway of 65 partitions": {pgdedup.Config{Consumer: "c", Retention: 12 * time.Hour, Partitions: 12, Runway: 65 * time.Hour}, "Runway"},
		"negative sent-at margin": {pgdedup.Config{Consumer: "c", SentAtMargin: -time.Second}, "SentAtMargin"},
		"hourly for 14 days": {pgdedup.Config{Consumer: "c", Layout: pgdedup.LayoutPartitioned, Retention: 14 * 24 * time.Hour,
			Partitions: 14 * 24}, "Partitions"},
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
	for _, ok := range []pgdedup.Config{
		{Consumer: "c"},
		{Consumer: strings.Repeat("c", pgdedup.MaxConsumerLen), Retention: pgdedup.MinRetention},
		{Consumer: "billing v2 (eu)", MaxBatch: 1},
	} {
		if err := ok.Validate(); err != nil {
			t.Errorf("%.20q: %v, want a valid Config", ok.Consumer, err)
		}
	}
	if _, err := pgdedup.New(nil, pgdedup.Config{Consumer: "c"}); err == nil {
		t.Error("New accepted a nil DB")
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM charges`); n != 0 {
		t.Fatal("charges touched")
	}
}

// A batch of more than Config.MaxBatch IDs is refused whole before anything
// is sent, by every call that claims batches; one of MaxBatch IDs goes through.
func TestBatchOverMaxBatchRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{MaxBatch: 3})
	ctx := ctxT(t)
	four := []string{"a", "b", "c", "d"}
	_, err := b.store.ProcessBatch(ctx, four, func(context.Context, pgx.Tx, []string) error {
		t.Error("fn ran for a batch over MaxBatch")
		return nil
	})
	if !errors.Is(err, pgdedup.ErrBatchTooLarge) || !strings.Contains(err.Error(), "4 IDs, more than Config.MaxBatch (3)") {
		t.Fatalf("ProcessBatch of 4: err=%v, want ErrBatchTooLarge naming the sizes", err)
	}
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := b.store.ClaimBatch(ctx, tx, four); !errors.Is(err, pgdedup.ErrBatchTooLarge) {
			t.Errorf("ClaimBatch of 4: err=%v, want ErrBatchTooLarge", err)
		}
		fresh, err := b.store.ClaimBatch(ctx, tx, four[:3])
		if err != nil || !slices.Equal(fresh, four[:3]) {
			t.Errorf("ClaimBatch of 3: fresh=%q err=%v, want all three", fresh, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE message_id = 'd'`); n != 0 {
		t.Fatal("an ID of the refused batch was recorded")
	}
}
