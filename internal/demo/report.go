package demo

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Row is one recipe's line in the report. Deliveries, Skipped and Crashes are
// what its handler reported. Charged, ChargedTwice and NeverCharged are
// counted from its business table after the run.
type Row struct {
	Recipe     string
	Table      string // business table, in Result.Schema
	Deliveries int64  // deliveries the recipe handled
	Skipped    int64  // deliveries it judged duplicates
	Crashes    int64  // deliveries whose handler died mid-way in it
	// Charged is the number of orders with at least one charge row.
	Charged int64
	// ChargedTwice is the number of orders with two or more charge rows.
	ChargedTwice int64
	// NeverCharged is the number of orders without any charge row.
	NeverCharged int64
}

// count fills r's charge columns from its business table.
func (r *Row) count(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	t := pgx.Identifier{schema, r.Table}.Sanitize()
	orders := pgx.Identifier{schema, "orders"}.Sanitize()
	err := pool.QueryRow(ctx, `
WITH per_order AS (SELECT order_id, count(*) AS n FROM `+t+` GROUP BY order_id)
SELECT
	(SELECT count(*) FROM per_order),
	(SELECT count(*) FROM per_order WHERE n > 1),
	(SELECT count(*) FROM `+orders+` o WHERE NOT EXISTS (SELECT 1 FROM `+t+` c WHERE c.order_id = o.id))`,
	).Scan(&r.Charged, &r.ChargedTwice, &r.NeverCharged)
	if err != nil {
		return fmt.Errorf("count charges in %s: %w", r.Table, err)
	}
	return nil
}

// checkPgdedup returns the pgdedup invariants that r (pgdedup's row) breaks.
// Every order must be charged exactly once, and processed_messages must hold
// exactly the IDs of the charged orders.
func checkPgdedup(ctx context.Context, pool *pgxpool.Pool, schema, consumer string, r Row, orders int) ([]string, error) {
	var fails []string
	if r.ChargedTwice != 0 {
		fails = append(fails, fmt.Sprintf("%d orders charged more than once", r.ChargedTwice))
	}
	if r.NeverCharged != 0 {
		fails = append(fails, fmt.Sprintf("%d orders never charged", r.NeverCharged))
	}
	var ids, unmatched int64
	err := pool.QueryRow(ctx, `
SELECT
	(SELECT count(*) FROM `+pgx.Identifier{schema, "processed_messages"}.Sanitize()+` WHERE consumer = $1),
	(SELECT count(*) FROM `+pgx.Identifier{schema, r.Table}.Sanitize()+` c WHERE NOT EXISTS (
		SELECT 1 FROM `+pgx.Identifier{schema, "processed_messages"}.Sanitize()+` p
		WHERE p.consumer = $1 AND p.message_id = 'order-' || c.order_id))`, consumer,
	).Scan(&ids, &unmatched)
	if err != nil {
		return nil, fmt.Errorf("check processed_messages: %w", err)
	}
	if ids != int64(orders) {
		fails = append(fails, fmt.Sprintf("processed_messages holds %d IDs for %d orders", ids, orders))
	}
	if unmatched != 0 {
		fails = append(fails, fmt.Sprintf("%d charges without their message ID in processed_messages", unmatched))
	}
	return fails, nil
}
