package faults

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// Queue is a durable at-least-once queue in a PostgreSQL table, with the
// semantics of SQS: a received message turns invisible for the visibility
// timeout and is delivered again unless it is acked (deleted) before then. A
// consumer that dies holding a message therefore loses nothing, and a slow one
// may see its message delivered to another consumer too: exactly the
// redeliveries pgdedup is there to absorb. Acked rows are kept, marked, so that
// the suite can count deliveries afterwards.
type Queue struct {
	db         pgtest.Querier
	table      string
	visibility time.Duration
}

// NewQueue creates the queue table name (in the connection's search_path) if
// it does not exist and opens it.
func NewQueue(ctx context.Context, db pgtest.Querier, name string, visibility time.Duration) (*Queue, error) {
	q := OpenQueue(db, name, visibility)
	_, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+q.table+` (
	id         text PRIMARY KEY,
	visible_at timestamptz NOT NULL DEFAULT clock_timestamp(),
	deliveries int NOT NULL DEFAULT 0,
	acked      bool NOT NULL DEFAULT false)`)
	if err == nil {
		_, err = db.Exec(ctx, `CREATE INDEX IF NOT EXISTS `+pgx.Identifier{name + "_visible"}.Sanitize()+
			` ON `+q.table+` (visible_at, id) WHERE NOT acked`)
	}
	if err != nil {
		return nil, fmt.Errorf("faults: create queue: %w", err)
	}
	return q, nil
}

// OpenQueue opens the existing queue table name.
func OpenQueue(db pgtest.Querier, name string, visibility time.Duration) *Queue {
	return &Queue{db: db, table: pgx.Identifier{name}.Sanitize(), visibility: visibility}
}

// Enqueue adds messages with the given IDs, visible at once.
func (q *Queue) Enqueue(ctx context.Context, ids []string) error {
	_, err := q.db.Exec(ctx, `INSERT INTO `+q.table+` (id) SELECT unnest($1::text[])`, ids)
	if err != nil {
		return fmt.Errorf("faults: enqueue: %w", err)
	}
	return nil
}

// Receive takes up to max visible messages, oldest first, and hides them for
// the visibility timeout. It returns none when no message is visible right now.
func (q *Queue) Receive(ctx context.Context, max int) ([]string, error) {
	rows, err := q.db.Query(ctx, `UPDATE `+q.table+`
SET visible_at = clock_timestamp() + $1 * interval '1 microsecond', deliveries = deliveries + 1
WHERE id IN (SELECT id FROM `+q.table+` WHERE NOT acked AND visible_at <= clock_timestamp()
             ORDER BY visible_at, id LIMIT $2 FOR UPDATE SKIP LOCKED)
RETURNING id`, q.visibility.Microseconds(), max)
	if err != nil {
		return nil, fmt.Errorf("faults: receive: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("faults: receive: %w", err)
	}
	return ids, nil
}

// Ack marks a message done: it will not be delivered again.
func (q *Queue) Ack(ctx context.Context, id string) error {
	if _, err := q.db.Exec(ctx, `UPDATE `+q.table+` SET acked = true WHERE id = $1`, id); err != nil {
		return fmt.Errorf("faults: ack %q: %w", id, err)
	}
	return nil
}

// Len returns how many messages are not acked yet, visible or not.
func (q *Queue) Len(ctx context.Context) (int, error) {
	var n int
	if err := q.db.QueryRow(ctx, `SELECT count(*) FROM `+q.table+` WHERE NOT acked`).Scan(&n); err != nil {
		return 0, fmt.Errorf("faults: queue length: %w", err)
	}
	return n, nil
}

// Deliveries returns how many times messages were received in all.
func (q *Queue) Deliveries(ctx context.Context) (int, error) {
	var n int
	if err := q.db.QueryRow(ctx, `SELECT coalesce(sum(deliveries), 0) FROM `+q.table).Scan(&n); err != nil {
		return 0, fmt.Errorf("faults: queue deliveries: %w", err)
	}
	return n, nil
}
