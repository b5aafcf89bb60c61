// Command outbox consumes orders from RabbitMQ exactly once with pgdedup and
// sends each order's confirmation (an HTTP POST) through River, the job queue
// on PostgreSQL, as a transactional outbox: the job is inserted with River's
// InsertTx in the transaction that claims the order's message ID and writes
// the order. A duplicate enqueues nothing, a rollback enqueues nothing, a
// commit enqueues exactly that order's job, and River's workers run it after
// COMMIT, with retries. See README.md.
//
//	outbox migrate   # pgdedup's and River's migrations, with goose
//	outbox run       # consume and work (CONSUME=0 or WORK=0 for one role)
//
// Settings: DATABASE_URL, AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/),
// QUEUE (default orders), CONFIRM_URL (the confirmation endpoint).
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/riverqueue/river"

	"github.com/pgdedup/pgdedup"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "outbox:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	switch cmp.Or(append(args, "")[0], "run") {
	case "migrate":
		if err := migrate(ctx, stdlib.OpenDBFromPool(pool)); err != nil {
			return err
		}
		_, err = pool.Exec(ctx, schema)
		return err
	case "run":
		return serve(ctx, pool, os.Getenv("CONSUME") != "0", os.Getenv("WORK") != "0")
	default:
		return fmt.Errorf("unknown command %q: want migrate or run", args[0])
	}
}

// schema is the service's own table.
const schema = `CREATE TABLE IF NOT EXISTS orders (order_id text PRIMARY KEY, amount_cents bigint NOT NULL)`

// serve runs River's workers (work) and the order consumer (consume) until
// ctx ends.
func serve(ctx context.Context, pool *pgxpool.Pool, consume, work bool) error {
	client, err := newRiver(pool, os.Getenv("CONFIRM_URL"), work)
	if err != nil {
		return err
	}
	if work {
		if err := client.Start(ctx); err != nil {
			return err
		}
		defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()
	}
	if !consume {
		<-ctx.Done()
		return nil
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "orders"})
	if err != nil {
		return err
	}
	return consumeQueue(ctx, store, client)
}

// consumeQueue acks each order after Process returned nil (after COMMIT, or
// for a duplicate) and requeues it on an error; an undecodable one is dropped.
func consumeQueue(ctx context.Context, store *pgdedup.Store, client *river.Client[pgx.Tx]) error {
	conn, err := amqp.Dial(cmp.Or(os.Getenv("AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/"))
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	queue := cmp.Or(os.Getenv("QUEUE"), "orders")
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return err
	}
	if err := ch.Qos(8, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	for {
		var d amqp.Delivery
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case d, ok = <-deliveries:
			if !ok {
				return errors.New("the broker closed the channel")
			}
		}
		processed, err := consume(ctx, store, client, d.Body)
		switch pgdedup.ActionFor(err) {
		case pgdedup.ActionAck:
			slog.Info("delivery", "outcome", map[bool]string{true: "processed", false: "duplicate"}[processed])
			err = d.Ack(false)
		case pgdedup.ActionRequeue:
			slog.Warn("delivery", "outcome", "failed", "err", err)
			err = d.Nack(false, true)
		case pgdedup.ActionStop: // SIGTERM: unacked, redelivered once the channel closes
			slog.Info("delivery", "outcome", "stopped", "err", err)
			return nil
		case pgdedup.ActionDeadLetter: // errPoison, or an order that can never be taken
			slog.Warn("delivery", "outcome", "rejected", "err", err)
			err = d.Nack(false, false)
		}
		if err != nil {
			return err
		}
	}
}
