// Package demo shows pgdedup against the deduplication recipes it replaces.
//
// Run creates a schema of its own, migrates it with pgdedup.Migrate, and feeds
// N orders through a simulated at-least-once broker to K concurrent consumers.
// The broker redelivers a share of the orders, some while the first delivery
// is still being handled and some later, and a share of deliveries crash
// mid-handler and are redelivered. Every delivery goes, at the same moment,
// through pgdedup and through three broken recipes (check-then-act, an
// in-process set per consumer, mark-then-process), each charging into a table
// of its own. The report counts each table's charges per order.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
)

// Options configures Run. The CLI's defaults are the Default constants, but
// Run takes every field as given (zero rates mean no duplicates, no crashes).
type Options struct {
	DatabaseURL   string    // required
	Orders        int       // orders the producer publishes (1-MaxOrders)
	Consumers     int       // concurrent consumers (1-MaxConsumers)
	RedeliverRate float64   // share of orders delivered twice (0-1)
	CrashRate     float64   // share of deliveries that crash mid-handler (0-MaxCrashRate)
	Seed          uint64    // seeds the broker's choices, or 0 to pick one at random
	Progress      io.Writer // where to draw a progress bar (a terminal), or nil
	Keep          bool      // leave the schema in place for inspection

	// beforeVerify runs after the simulation, before the tables are counted.
	// Tests use it to break an invariant on purpose.
	beforeVerify func(ctx context.Context, pool *pgxpool.Pool, schema string) error
}

// The CLI's defaults, and the bounds Validate enforces.
const (
	DefaultOrders        = 10_000
	DefaultConsumers     = 8
	DefaultRedeliverRate = 0.3
	DefaultCrashRate     = 0.05
	MaxOrders            = 1_000_000
	MaxConsumers         = 32 // the pool holds up to 2 connections per consumer
	MaxCrashRate         = 0.9
)

// ErrInvariant is returned when pgdedup's row shows a double or a missing
// charge, which means the demo's reason to exist has failed.
var ErrInvariant = errors.New("pgdedup invariant violated")

// Result is what Run measured.
type Result struct {
	Options  Options // as given, with the seed filled in
	Schema   string
	Dropped  bool
	Broker   BrokerStats
	Rows     []Row    // pgdedup first, then the broken recipes
	Failures []string // pgdedup invariants that failed, empty on success
	Elapsed  time.Duration
}

// BrokerStats counts what the simulated broker did.
type BrokerStats struct {
	Deliveries      int // handed to consumers
	ConcurrentDups  int // duplicates queued right behind the original, so another consumer takes them while it runs
	LaterDups       int // duplicates redelivered later
	CrashRedelivers int // deliveries nacked by a crash and redelivered
}

// Validate reports, before any connection, what in o is out of range. The
// database URL is checked by Run, because the CLI chooses a server after
// validating.
func (o Options) Validate() error {
	switch {
	case o.Orders < 1 || o.Orders > MaxOrders:
		return fmt.Errorf("orders must be between 1 and %d, got %d", MaxOrders, o.Orders)
	case o.Consumers < 1 || o.Consumers > MaxConsumers:
		return fmt.Errorf("consumers must be between 1 and %d, got %d", MaxConsumers, o.Consumers)
	case !(o.RedeliverRate >= 0 && o.RedeliverRate <= 1):
		return fmt.Errorf("redelivery rate must be between 0 and 1, got %g", o.RedeliverRate)
	case !(o.CrashRate >= 0 && o.CrashRate <= MaxCrashRate):
		return fmt.Errorf("crash rate must be between 0 and %g, got %g", MaxCrashRate, o.CrashRate)
	}
	return nil
}

// consumerName is the pgdedup consumer the demo records IDs under.
const consumerName = "demo-billing"

// Run runs the demo and returns its result. The error wraps ErrInvariant when
// pgdedup's row shows a double or missing charge. The Result is then complete
// and worth printing. The schema is dropped unless opts.Keep, even on failure.
func Run(ctx context.Context, opts Options) (res *Result, err error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.DatabaseURL == "" {
		return nil, errors.New("a database URL is required")
	}
	if opts.Seed == 0 {
		opts.Seed = rand.Uint64N(1_000_000) + 1
	}
	start := time.Now()
	res = &Result{Options: opts, Schema: newSchemaName()}
	pool, err := connect(ctx, opts.DatabaseURL, res.Schema, opts.Consumers)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := createSchema(ctx, pool, res.Schema); err != nil {
		return res, err
	}
	defer func() { // only once the schema is ours
		if opts.Keep {
			return
		}
		if derr := dropSchema(pool, res.Schema); derr != nil {
			err = errors.Join(err, derr)
			return
		}
		res.Dropped = true
	}()

	store, err := pgdedup.New(pool, pgdedup.Config{
		Consumer: consumerName,
		Table:    res.Schema + ".processed_messages", // the schema name is a plain identifier
	})
	if err != nil {
		return res, err
	}
	ch := func(table string) charger { return newCharger(pool, res.Schema, table) }
	recipes := []recipe{
		pgdedupRecipe{store: store, charger: ch(tablePgdedup)},
		checkThenAct{keys: newKeyStore(), charger: ch(tableCheckThenAct)},
		newInProcessSet(opts.Consumers, ch(tableInProcessSet)),
		markThenProcess{keys: newKeyStore(), charger: ch(tableMarkThenProcess)},
	}
	if err := setUp(ctx, pool, res.Schema, opts.Orders, recipes); err != nil {
		return res, err
	}

	b := newBroker(opts.Orders, opts.RedeliverRate, opts.CrashRate, opts.Consumers, opts.Seed)
	tallies := make([]*tally, len(recipes))
	for i := range tallies {
		tallies[i] = &tally{}
	}
	stopProgress := startProgress(opts.Progress, b)
	err = simulate(ctx, b, opts.Consumers, recipes, tallies)
	stopProgress()
	if ctx.Err() != nil {
		return res, fmt.Errorf("interrupted: %w", ctx.Err())
	}
	if err != nil {
		return res, fmt.Errorf("simulation: %w", err)
	}
	res.Broker = b.snapshot()

	if opts.beforeVerify != nil {
		if err := opts.beforeVerify(ctx, pool, res.Schema); err != nil {
			return res, err
		}
	}
	for i, r := range recipes {
		row := Row{Recipe: r.name(), Table: r.table(), Deliveries: tallies[i].deliveries.Load(),
			Skipped: tallies[i].skipped.Load(), Crashes: tallies[i].crashes.Load()}
		if err := row.count(ctx, pool, res.Schema); err != nil {
			return res, err
		}
		res.Rows = append(res.Rows, row)
	}
	res.Failures, err = checkPgdedup(ctx, pool, res.Schema, consumerName, res.Rows[0], opts.Orders)
	if err != nil {
		return res, err
	}
	res.Elapsed = time.Since(start)
	if len(res.Failures) > 0 {
		return res, fmt.Errorf("%w: %s", ErrInvariant, strings.Join(res.Failures, "; "))
	}
	return res, nil
}
