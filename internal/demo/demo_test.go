package demo

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// schemaExists reports whether schema is in the test database.
func schemaExists(t *testing.T, schema string) bool {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func runSmall(t *testing.T, opts Options) (*Result, error) {
	t.Helper()
	opts.DatabaseURL = pgtest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return Run(ctx, opts)
}

// With duplicates and crashes, pgdedup charges every order exactly once and
// the schema is gone afterwards. Each broken recipe breaks the way it should.
func TestRunPgdedupChargesEveryOrderOnce(t *testing.T) {
	t.Parallel()
	const orders = 300
	res, err := runSmall(t, Options{Orders: orders, Consumers: 4, RedeliverRate: 0.5, CrashRate: 0.2, Seed: 7})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var out strings.Builder
	res.WriteTable(&out)
	t.Logf("\n%s", out.String())

	pg := res.Rows[0]
	if pg.Charged != orders || pg.ChargedTwice != 0 || pg.NeverCharged != 0 {
		t.Errorf("pgdedup charged %d orders, %d twice, %d never; want %d, 0, 0", pg.Charged, pg.ChargedTwice, pg.NeverCharged, orders)
	}
	if len(res.Failures) != 0 {
		t.Errorf("Failures = %v", res.Failures)
	}
	if res.Broker.ConcurrentDups == 0 || res.Broker.LaterDups == 0 || res.Broker.CrashRedelivers == 0 {
		t.Errorf("broker made no duplicates or crashes of some kind: %+v", res.Broker)
	}
	for _, row := range res.Rows {
		if row.Deliveries != int64(res.Broker.Deliveries) {
			t.Errorf("%s handled %d deliveries, broker made %d", row.Recipe, row.Deliveries, res.Broker.Deliveries)
		}
	}
	// About 45 crashes after the charge for check-then-act and as many before
	// it for mark-then-process, and ~150 duplicates for the in-process set.
	// None of these can come out at zero unless the recipe stopped breaking.
	byTable := map[string]Row{}
	for _, row := range res.Rows {
		byTable[row.Table] = row
	}
	if r := byTable[tableCheckThenAct]; r.ChargedTwice == 0 {
		t.Errorf("check-then-act charged no order twice")
	}
	if r := byTable[tableInProcessSet]; r.ChargedTwice == 0 {
		t.Errorf("in-process set charged no order twice")
	}
	if r := byTable[tableMarkThenProcess]; r.NeverCharged == 0 {
		t.Errorf("mark-then-process lost no order")
	}
	if !res.Dropped || schemaExists(t, res.Schema) {
		t.Errorf("schema %s not dropped (Dropped=%v)", res.Schema, res.Dropped)
	}
}

// A double and a missing charge in pgdedup's table make Run fail with
// ErrInvariant, and the schema is still dropped.
func TestRunReportsBrokenInvariant(t *testing.T) {
	t.Parallel()
	res, err := runSmall(t, Options{Orders: 50, Consumers: 2, RedeliverRate: 0.3, CrashRate: 0.1,
		beforeVerify: func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
			tbl := pgx.Identifier{schema, tablePgdedup}.Sanitize()
			_, err := pool.Exec(ctx, `INSERT INTO `+tbl+` (order_id, amount_cents, consumer, attempt) VALUES (3, 1, 0, 1);
DELETE FROM `+tbl+` WHERE order_id = 4`)
			return err
		}})
	if !errors.Is(err, ErrInvariant) {
		t.Fatalf("Run error = %v, want ErrInvariant", err)
	}
	pg := res.Rows[0]
	if pg.ChargedTwice != 1 || pg.NeverCharged != 1 {
		t.Errorf("pgdedup row: %d charged twice, %d never; want 1 and 1", pg.ChargedTwice, pg.NeverCharged)
	}
	if len(res.Failures) == 0 {
		t.Errorf("no Failures reported")
	}
	if !res.Dropped || schemaExists(t, res.Schema) {
		t.Errorf("schema %s not dropped after a failure", res.Schema)
	}
}

// --keep leaves the schema, with its business tables, for inspection.
func TestRunKeepsSchema(t *testing.T) {
	t.Parallel()
	res, err := runSmall(t, Options{Orders: 20, Consumers: 2, Keep: true})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Cleanup(func() {
		pool, err := pgxpool.New(context.Background(), pgtest.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		if err := dropSchema(pool, res.Schema); err != nil {
			t.Error(err)
		}
	})
	if res.Dropped || !schemaExists(t, res.Schema) {
		t.Fatalf("schema %s was dropped despite Keep", res.Schema)
	}
	if pg := res.Rows[0]; pg.Charged != 20 || pg.ChargedTwice != 0 || pg.NeverCharged != 0 {
		t.Errorf("pgdedup row %+v, want 20 charged once", pg)
	}
}

// Bad options are rejected before any connection is tried.
func TestRunRejectsBadOptions(t *testing.T) {
	t.Parallel()
	unreachable := "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"
	for name, o := range map[string]Options{
		"no URL":          {},
		"orders":          {DatabaseURL: unreachable, Orders: -1},
		"consumers":       {DatabaseURL: unreachable, Consumers: MaxConsumers + 1},
		"redelivery rate": {DatabaseURL: unreachable, RedeliverRate: 1.5},
		"crash rate":      {DatabaseURL: unreachable, CrashRate: 0.95},
		"negative rate":   {DatabaseURL: unreachable, CrashRate: -0.1},
	} {
		_, err := Run(context.Background(), o)
		if err == nil || strings.Contains(err.Error(), "connect") {
			t.Errorf("%s: Run error = %v, want a validation error", name, err)
		}
	}
}
