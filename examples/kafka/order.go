package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

// Order is the value of one record on the orders topic, keyed by OrderID:
// charge a customer for an order. A record that does not decode
// ([shop.DecodeOrder]) is committed like any other, without a charge.
type Order = shop.Order

// schemaDDL is the business tables. charges deliberately has no unique
// constraint on order_id, so that a double charge shows instead of turning
// into an error; records_seen counts the records each partition's transactions
// applied, so that a record applied twice (or never) shows too.
const schemaDDL = `CREATE TABLE IF NOT EXISTS charges (
	id            bigserial   PRIMARY KEY,
	order_id      text        NOT NULL,
	customer      text        NOT NULL,
	amount_cents  bigint      NOT NULL,
	topic         text        NOT NULL,
	partition     integer     NOT NULL,
	record_offset bigint      NOT NULL,
	charged_by    text        NOT NULL,
	charged_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS charges_order_id_idx ON charges (order_id);
CREATE TABLE IF NOT EXISTS records_seen (
	topic     text    NOT NULL,
	partition integer NOT NULL,
	records   bigint  NOT NULL,
	PRIMARY KEY (topic, partition)
)`

// migrate creates pgdedup's tables (processed_offsets among them) and the
// business tables in the search_path of pool's connections.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return shop.MigrateWith(ctx, pool, schemaDDL)
}

// record is one fetched record of a batch: its offset and its order, or why it
// has none.
type record struct {
	offset int64
	order  Order
	bad    error
}

// chargeResult is what chargeBatch did with a batch's fresh records.
type chargeResult struct {
	charged       int // orders charged
	producedTwice int // records of an order already charged: the producer sent it twice
	rejected      int // unparseable records, committed without a charge
}

// chargeBatch charges the orders of recs, the fresh records of one partition,
// in tx, the transaction that advances the partition's offset: all of it
// commits together or not at all. It is one round trip.
//
// An order the producer sent twice is two records with two offsets, which the
// offset cannot tell apart; the NOT EXISTS skips the second. It is race-free
// because records are keyed by order ID, so both copies are in the same
// partition, and the offset claim holds the partition's row lock: no other
// transaction charges from that partition until this one ends.
func chargeBatch(ctx context.Context, tx pgx.Tx, topic string, partition int32, chargedBy string, recs []record) (chargeResult, error) {
	var res chargeResult
	var ids, customers []string
	var amounts, offsets []int64
	for _, r := range recs {
		if r.bad != nil {
			res.rejected++
			continue
		}
		ids, customers = append(ids, r.order.OrderID), append(customers, r.order.Customer)
		amounts, offsets = append(amounts, r.order.AmountCents), append(offsets, r.offset)
	}
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO charges (order_id, customer, amount_cents, topic, partition, record_offset, charged_by)
SELECT DISTINCT ON (o.order_id) o.order_id, o.customer, o.amount_cents, $5, $6, o.off, $7
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS o(order_id, customer, amount_cents, off)
WHERE NOT EXISTS (SELECT 1 FROM charges c WHERE c.order_id = o.order_id)
ORDER BY o.order_id, o.off`, ids, customers, amounts, offsets, topic, partition, chargedBy)
	b.Queue(`INSERT INTO records_seen (topic, partition, records) VALUES ($1, $2, $3)
ON CONFLICT (topic, partition) DO UPDATE SET records = records_seen.records + EXCLUDED.records`, topic, partition, len(recs))
	br := tx.SendBatch(ctx, b)
	tag, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return chargeResult{}, fmt.Errorf("charge %s/%d: %w", topic, partition, err)
	}
	res.charged = int(tag.RowsAffected())
	res.producedTwice = len(ids) - res.charged
	return res, nil
}
