// Package shop is what the broker examples share: the order a message
// carries, its validation, and the charge written in pgdedup's transaction.
package shop

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
)

// Order is the body of one message on the orders queue or subject: charge a
// customer for an order. The broker may deliver it more than once; the charge
// must happen once.
type Order struct {
	OrderID     string `json:"order_id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

// ErrBadOrder marks a message that can never be processed (not JSON, missing
// fields). Redelivering it would loop forever, so the consumer rejects (or
// terminates) it instead.
var ErrBadOrder = errors.New("bad order message")

// DecodeOrder parses and checks a message body before anything touches the
// database.
func DecodeOrder(body []byte) (Order, error) {
	var o Order
	if err := json.Unmarshal(body, &o); err != nil {
		return Order{}, fmt.Errorf("%w: %v", ErrBadOrder, err)
	}
	switch {
	case o.OrderID == "":
		return Order{}, fmt.Errorf("%w: order_id is empty", ErrBadOrder)
	case o.AmountCents <= 0:
		return Order{}, fmt.Errorf("%w: order %s: amount_cents must be positive, got %d", ErrBadOrder, o.OrderID, o.AmountCents)
	}
	return o, nil
}

// ChargesDDL is the business table. It deliberately has no unique constraint
// on order_id: a ledger often may hold several charges for one order, and here
// it makes a double charge visible instead of turning it into an error.
// processed_messages is what keeps each message's charge to one row.
const ChargesDDL = `CREATE TABLE IF NOT EXISTS charges (
	id           bigserial   PRIMARY KEY,
	order_id     text        NOT NULL,
	customer     text        NOT NULL,
	amount_cents bigint      NOT NULL,
	message_id   text        NOT NULL,
	charged_by   text        NOT NULL,
	charged_at   timestamptz NOT NULL DEFAULT now()
)`

// Migrate creates pgdedup's processed_messages and the charges table in the
// search_path of pool's connections. Both are idempotent.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return MigrateWith(ctx, pool, ChargesDDL)
}

// MigrateWith creates pgdedup's tables and then runs ddl, the business
// tables, in the search_path of pool's connections. Both must be idempotent;
// they are safe to run from several processes at once: concurrent CREATE
// TABLE IF NOT EXISTS can still collide on the catalog, so a
// transaction-scoped advisory lock makes starting consumers take turns.
func MigrateWith(ctx context.Context, pool *pgxpool.Pool, ddl string) error {
	db := stdlib.OpenDBFromPool(pool)
	defer func(db *sql.DB) { _ = db.Close() }(db)
	if err := pgdedup.Migrate(ctx, db); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(7070707)`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("create business tables: %w", err)
		}
		return nil
	})
}

// Charge records the charge for o in tx, the transaction in which pgdedup
// claimed the message: both commit together or not at all.
func Charge(ctx context.Context, tx pgx.Tx, o Order, messageID, chargedBy string) error {
	_, err := tx.Exec(ctx,
		`INSERT INTO charges (order_id, customer, amount_cents, message_id, charged_by) VALUES ($1, $2, $3, $4, $5)`,
		o.OrderID, o.Customer, o.AmountCents, messageID, chargedBy)
	if err != nil {
		return fmt.Errorf("charge order %s: %w", o.OrderID, err)
	}
	return nil
}
