package demo

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
)

// outcome is what one recipe did with one delivery.
type outcome int

const (
	charged outcome = iota // the handler ran to the end
	skipped                // the recipe judged it a duplicate
	crashed                // the consumer died mid-handler
)

// recipe is one way of deduplicating deliveries. Each writes its charges to a
// business table of its own, and the report counts the rows there.
type recipe interface {
	// name is the row label in the report.
	name() string
	// table is the recipe's business table, unqualified.
	table() string
	// handle runs delivery d on consumer c. A d.crash interrupts it at that
	// point, as if the process died there. Errors other than the simulated
	// crash are real failures and stop the demo.
	handle(ctx context.Context, c int, d delivery) (outcome, error)
	// restart tells the recipe that consumer c crashed and was restarted.
	restart(c int)
}

// The business tables, one per recipe.
const (
	tablePgdedup         = "charges_pgdedup"
	tableCheckThenAct    = "charges_check_then_act"
	tableInProcessSet    = "charges_in_process_set"
	tableMarkThenProcess = "charges_mark_then_process"
)

// errCrash stands for the consumer process dying. The handler goes no further.
var errCrash = errors.New("demo: simulated crash")

// charger writes one charge row to a recipe's business table, committed on its
// own (or in tx when the recipe has one).
type charger struct {
	pool *pgxpool.Pool
	sql  string
}

func newCharger(pool *pgxpool.Pool, schema, table string) charger {
	t := pgx.Identifier{schema, table}.Sanitize()
	return charger{pool: pool, sql: `INSERT INTO ` + t + ` (order_id, amount_cents, consumer, attempt)
SELECT id, amount_cents, $2, $3 FROM ` + pgx.Identifier{schema, "orders"}.Sanitize() + ` WHERE id = $1`}
}

// execer is what charge writes with, the pool (autocommit) or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func (ch charger) charge(ctx context.Context, db execer, c int, d delivery) error {
	_, err := db.Exec(ctx, ch.sql, d.order, c, d.attempt)
	return err
}

// work stands for the handler's own work (calling the payment provider) before
// it can record the charge.
func work(ctx context.Context, d delivery) error {
	t := time.NewTimer(d.work)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// pgdedupRecipe is the pattern done right. Store.Process claims the message ID
// in the transaction that writes the charge. A crash before COMMIT rolls both
// back, so the redelivery charges. A duplicate, concurrent or later, finds the
// ID (waiting for the first transaction if it is still running) and skips.
type pgdedupRecipe struct {
	store *pgdedup.Store
	charger
}

func (pgdedupRecipe) name() string  { return "pgdedup (claim in the charge's tx)" }
func (pgdedupRecipe) table() string { return tablePgdedup }
func (pgdedupRecipe) restart(int)   {}

func (r pgdedupRecipe) handle(ctx context.Context, c int, d delivery) (outcome, error) {
	processed, err := r.store.Process(ctx, d.messageID(), func(ctx context.Context, tx pgx.Tx) error {
		if err := work(ctx, d); err != nil {
			return err
		}
		if d.crash == crashBeforeCharge {
			return errCrash
		}
		if err := r.charge(ctx, tx, c, d); err != nil {
			return err
		}
		if d.crash == crashAfterCharge {
			return errCrash // the transaction is abandoned before COMMIT
		}
		return nil
	})
	switch {
	case errors.Is(err, errCrash):
		return crashed, nil
	case err != nil:
		return 0, err
	case !processed:
		return skipped, nil
	}
	return charged, nil
}
