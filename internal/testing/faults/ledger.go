package faults

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// Ledger is the suite's business table: one row per effect of a message, with
// no unique constraint, so that a message processed twice shows up twice. It
// stands for the charges a payment consumer would insert.
type Ledger struct {
	table string
}

// NewLedger creates the ledger table name (in the connection's search_path)
// if it does not exist and opens it.
func NewLedger(ctx context.Context, db pgtest.Querier, name string) (*Ledger, error) {
	l := OpenLedger(name)
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+l.table+` (
	message_id text NOT NULL,
	written_at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		return nil, fmt.Errorf("faults: create ledger: %w", err)
	}
	return l, nil
}

// OpenLedger opens the existing ledger table name.
func OpenLedger(name string) *Ledger {
	return &Ledger{table: pgx.Identifier{name}.Sanitize()}
}

// Write records one effect of message id in tx, the business write.
func (l *Ledger) Write(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+l.table+` (message_id) VALUES ($1)`, id)
	return err
}

// Tally is the outcome of a scenario, message by message.
type Tally struct {
	Messages   int // messages sent
	Once       int // messages with exactly one effect
	Lost       int // messages with no effect
	Doubled    int // messages with more than one effect
	Extra      int // effects beyond the first, summed over doubled messages
	Unexpected int // effects of IDs that were never sent
}

func (t Tally) String() string {
	return fmt.Sprintf("messages=%d once=%d lost=%d doubled=%d extra_effects=%d unexpected=%d",
		t.Messages, t.Once, t.Lost, t.Doubled, t.Extra, t.Unexpected)
}

// Tally counts the effects of each of ids.
func (l *Ledger) Tally(ctx context.Context, db pgtest.Querier, ids []string) (Tally, error) {
	rows, err := db.Query(ctx, `SELECT message_id, count(*) FROM `+l.table+` GROUP BY message_id`)
	if err != nil {
		return Tally{}, fmt.Errorf("faults: tally: %w", err)
	}
	effects := map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { effects[id] = n; return nil }); err != nil {
		return Tally{}, fmt.Errorf("faults: tally: %w", err)
	}
	t := Tally{Messages: len(ids)}
	for _, id := range ids {
		switch n := effects[id]; {
		case n == 0:
			t.Lost++
		case n == 1:
			t.Once++
		default:
			t.Doubled++
			t.Extra += n - 1
		}
		delete(effects, id)
	}
	t.Unexpected = len(effects)
	return t, nil
}
