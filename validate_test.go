package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

var badIDs = map[string]string{
	"empty":        "",
	"NUL":          "a\x00b",
	"invalid UTF8": "a\xffb",
	"1025 bytes":   strings.Repeat("x", pgdedup.MaxMessageIDLen+1),
	"1 MB":         strings.Repeat("x", 1<<20),
}

// countingTracer counts the queries and batches a pool sends.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// Invalid IDs are rejected with ErrInvalidMessageID before anything is sent.
func TestInvalidIDsRejectedBeforeRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	tracer := &countingTracer{}
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	txStore, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	fn := func(context.Context, pgx.Tx) error { t.Error("fn called for an invalid ID"); return nil }
	for name, id := range badIDs {
		if _, err := store.Process(ctx, id, fn); !errors.Is(err, pgdedup.ErrInvalidMessageID) {
			t.Errorf("Process(%s): %v, want ErrInvalidMessageID", name, err)
		}
		if _, err := txStore.Claim(ctx, tx, id); !errors.Is(err, pgdedup.ErrInvalidMessageID) {
			t.Errorf("Claim(%s): %v, want ErrInvalidMessageID", name, err)
		}
		batch := []string{"ok-1", "ok-2", id, "ok-3"}
		_, err := txStore.ClaimBatch(ctx, tx, batch)
		if !errors.Is(err, pgdedup.ErrInvalidMessageID) || !strings.Contains(err.Error(), "message 2 of 4") {
			t.Errorf("ClaimBatch with %s at index 2: %v, want ErrInvalidMessageID naming index 2", name, err)
		}
		_, err = store.ProcessBatch(ctx, batch, func(context.Context, pgx.Tx, []string) error {
			t.Error("fn called for a batch with an invalid ID")
			return nil
		})
		if !errors.Is(err, pgdedup.ErrInvalidMessageID) {
			t.Errorf("ProcessBatch with %s: %v", name, err)
		}
		if len(err.Error()) > 200 {
			t.Errorf("error for %s is %d bytes long; it should not echo the ID", name, len(err.Error()))
		}
	}
	if n := tracer.n.Load(); n != 0 {
		t.Fatalf("%d queries sent for invalid input, want 0", n)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("rejected claims broke the caller's transaction: %v", err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatalf("%d IDs recorded from rejected batches, want 0", n)
	}
}

func TestLongestValidIDRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	id := strings.Repeat("é", pgdedup.MaxMessageIDLen/2) // 1024 bytes of 2-byte runes
	if ok, err := b.store.Process(ctx, id, charge("o")); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if !recorded(t, b.pool, "billing", id) {
		t.Fatal("ID not stored byte for byte")
	}
}

// New rejects a bad Config before touching the database with a *ConfigError
// naming the field, and Validate says the same without a database. Zero
// values are not errors: they take the defaults.
func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	for name, c := range map[string]struct {
		cfg   pgdedup.Config
		field string
	}{
		"no consumer":            {pgdedup.Config{}, "Consumer"},
		"consumer NUL":           {pgdedup.Config{Consumer: "a\x00"}, "Consumer"},
		"consumer not UTF-8":     {pgdedup.Config{Consumer: "a\xff"}, "Consumer"},
		"table injection":        {pgdedup.Config{Consumer: "c", Table: `processed_messages; DROP TABLE charges; --`}, "Table"},
		"table quote":            {pgdedup.Config{Consumer: "c", Table: `x"y`}, "Table"},
		"table three parts":      {pgdedup.Config{Consumer: "c", Table: "a.b.c"}, "Table"},
		"table empty part":       {pgdedup.Config{Consumer: "c", Table: "public."}, "Table"},
		"table leading digit":    {pgdedup.Config{Consumer: "c", Table: "1table"}, "Table"},
		"table too long":         {pgdedup.Config{Consumer: "c", Table: strings.Repeat("t", 64)}, "Table"},
		"offset table":           {pgdedup.Config{Consumer: "c", OffsetTable: "a.b.c"}, "OffsetTable"},
		"negative retention":     {pgdedup.Config{Consumer: "c", Retention: -time.Hour}, "Retention"},
		"negative lock timeout":  {pgdedup.Config{Consumer: "c", LockTimeout: -time.Second}, "LockTimeout"},
		"negative attempts":      {pgdedup.Config{Consumer: "c", MaxAttempts: -1}, "MaxAttempts"},
		"negative cleanup batch": {pgdedup.Config{Consumer: "c", CleanupBatchSize: -5}, "CleanupBatchSize"},
		"read-only transactions": {pgdedup.Config{Consumer: "c", TxOptions: pgx.TxOptions{AccessMode: pgx.ReadOnly}}, "TxOptions"},
	} {
		_, err := pgdedup.New(b.pool, c.cfg)
		var ce *pgdedup.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || !strings.HasPrefix(err.Error(), "pgdedup: Config."+c.field+" ") {
			t.Errorf("%s: New returned %v, want a ConfigError for %s", name, err, c.field)
		}
		if verr := c.cfg.Validate(); verr == nil || verr.Error() != fmt.Sprint(err) {
			t.Errorf("%s: Validate returned %v, New %v", name, verr, err)
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

func FuzzValidateMessageID(f *testing.F) {
	for _, id := range badIDs {
		if len(id) < 2000 {
			f.Add(id)
		}
	}
	f.Add("order-42")
	f.Add("é")
	f.Add(strings.Repeat("x", pgdedup.MaxMessageIDLen))
	f.Fuzz(func(t *testing.T, id string) {
		err := pgdedup.ValidateMessageID(id)
		want := id != "" && len(id) <= pgdedup.MaxMessageIDLen && utf8.ValidString(id) && !strings.ContainsRune(id, 0)
		if (err == nil) != want {
			t.Fatalf("ValidateMessageID(%q) = %v, want valid=%v", id, err, want)
		}
		if err != nil && !errors.Is(err, pgdedup.ErrInvalidMessageID) {
			t.Fatalf("error %v does not wrap ErrInvalidMessageID", err)
		}
	})
}
