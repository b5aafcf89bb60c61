package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

// consumerConfig is what one consumer process needs; main fills it from flags
// and environment variables.
type consumerConfig struct {
	AMQPURL         string
	DatabaseURL     string
	Queue           string
	Name            string        // this process, recorded in charges.charged_by and the AMQP connection name
	Prefetch        int           // unacked deliveries RabbitMQ hands this process at once
	Workers         int           // deliveries processed concurrently
	LockTimeout     time.Duration // pgdedup.Config.LockTimeout: give up on a duplicate still in flight elsewhere
	HandlerDelay    time.Duration // simulated work inside the transaction, e.g. a call to a payment API
	ShutdownTimeout time.Duration // how long SIGTERM waits for in-flight deliveries
	Log             *slog.Logger
}

// consumer charges orders from a RabbitMQ queue, each message once.
type consumer struct {
	cfg   consumerConfig
	store *pgdedup.Store
	stats stats
}

// consume runs a consumer until ctx is cancelled (SIGTERM) or the broker
// connection is lost. On cancel it stops taking deliveries, finishes and acks
// the ones it already holds, then closes; anything left unacked (a timeout, a
// crash) RabbitMQ redelivers to another consumer, and pgdedup skips what had
// already committed.
func consume(ctx context.Context, cfg consumerConfig) error {
	pool, store, err := shop.OpenStore(ctx, cfg.DatabaseURL, cfg.Workers, cfg.LockTimeout, cfg.Log)
	if err != nil {
		return err
	}
	defer pool.Close()
	c := &consumer{cfg: cfg, store: store}

	conn, err := amqp.DialConfig(cfg.AMQPURL, amqp.Config{Properties: amqp.Table{"connection_name": cfg.Name}})
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	defer conn.Close()
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := declareQueue(ch, cfg.Queue); err != nil {
		return err
	}
	// Prefetch bounds what a crash hands back to the broker, and keeps workers busy.
	if err := ch.Qos(cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	deliveries, err := ch.Consume(cfg.Queue, cfg.Name, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", cfg.Queue, err)
	}
	cfg.Log.Info("consuming", "queue", cfg.Queue, "prefetch", cfg.Prefetch, "workers", cfg.Workers)

	// Workers keep going after ctx is cancelled: a transaction half done at
	// SIGTERM is finished and acked rather than thrown away.
	workCtx := context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Go(func() {
			for d := range deliveries {
				c.handle(workCtx, d)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	select {
	case amqpErr := <-connClosed:
		<-done // the library closes deliveries with the connection
		return fmt.Errorf("RabbitMQ connection lost: %v", amqpErr)
	case <-done:
		return errors.New("RabbitMQ closed the delivery stream")
	case <-ctx.Done():
	}
	cfg.Log.Info("shutting down: no new deliveries, finishing the ones held")
	// Cancel waits for the broker's cancel-ok, so every delivery sent before it
	// reaches the deliveries channel, which then closes: the workers drain it.
	if err := ch.Cancel(cfg.Name, false); err != nil {
		return fmt.Errorf("cancel consumer: %w", err)
	}
	select {
	case <-done:
	case <-time.After(cfg.ShutdownTimeout):
		return fmt.Errorf("shutdown: deliveries still in flight after %s; RabbitMQ redelivers them", cfg.ShutdownTimeout)
	}
	c.stats.log(cfg.Log, "stopped")
	return nil
}

// handle processes one delivery and settles it as pgdedup.ActionFor says:
// ack when its charge is committed or it is a duplicate, requeue when it may
// succeed later, leave it when shutting down, reject when it never can.
func (c *consumer) handle(ctx context.Context, d amqp.Delivery) {
	// The producer's MessageId names the intent, so a republished message is
	// recognised; without one, identical bodies are taken as the same order.
	id := d.MessageId
	if id == "" {
		id = pgdedup.MessageIDFromContent(d.Body)
	}
	log := c.cfg.Log.With("message_id", id, "redelivered", d.Redelivered)
	order, err := shop.DecodeOrder(d.Body)
	if err == nil {
		err = pgdedup.ValidateMessageID(id)
	}
	if err != nil {
		log.Warn("delivery", "outcome", "rejected", "error", err)
		c.stats.add(&c.stats.rejected, d.Redelivered)
		settle(log, d.Reject(false)) // dead-lettered if the queue has a dead-letter exchange
		return
	}

	processed, err := c.store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
		if err := shop.Charge(ctx, tx, order, id, c.cfg.Name); err != nil {
			return err
		}
		return sleep(ctx, c.cfg.HandlerDelay)
	}, sentAt(d))
	switch pgdedup.ActionFor(err) {
	case pgdedup.ActionAck:
		settle(log, d.Ack(false)) // a duplicate is done too: ack, or it comes back forever
		if processed {
			log.Debug("delivery", "outcome", "processed", "order_id", order.OrderID)
			c.stats.add(&c.stats.processed, d.Redelivered)
		} else {
			log.Debug("delivery", "outcome", "duplicate", "order_id", order.OrderID)
			c.stats.add(&c.stats.duplicates, d.Redelivered)
		}
	case pgdedup.ActionRequeue:
		if errors.Is(err, pgdedup.ErrInFlight) {
			// Another delivery of the same message holds the claim; requeue this
			// one: it is skipped later if that one commits, processed if it fails.
			log.Debug("delivery", "outcome", "in_flight", "order_id", order.OrderID)
			c.stats.add(&c.stats.inFlight, d.Redelivered)
		} else {
			log.Error("delivery", "outcome", "failed", "order_id", order.OrderID, "error", err)
			c.stats.add(&c.stats.failed, d.Redelivered)
			_ = sleep(ctx, time.Second) // don't spin on a database that is down
		}
		settle(log, d.Nack(false, true))
	case pgdedup.ActionStop:
		// Shutting down: left unacked, RabbitMQ redelivers it when the
		// channel closes.
		log.Info("delivery", "outcome", "stopped", "order_id", order.OrderID, "error", err)
	case pgdedup.ActionDeadLetter:
		log.Warn("delivery", "outcome", "rejected", "order_id", order.OrderID, "error", err)
		c.stats.add(&c.stats.rejected, d.Redelivered)
		settle(log, d.Reject(false)) // dead-lettered if the queue has a dead-letter exchange
	}
}

// sentAt passes the message's timestamp property to pgdedup.WithSentAt, when
// the producer set one: a redelivery keeps it, so on the partitioned table
// the claim looks only in the partitions from that time less
// Config.SentAtMargin on, and a message older than the Retention is refused
// (pgdedup.ErrTooLate: dead-lettered) rather than processed after its ID may
// have been forgotten. A producer that republishes an ID stamps it anew; the
// margin (an hour by default) must cover how long it keeps retrying. The
// property has whole seconds, truncated, which errs on the safe side.
// Without it the claim has no time: every partition is looked in.
func sentAt(d amqp.Delivery) pgdedup.Option {
	if d.Timestamp.IsZero() {
		return nil
	}
	return pgdedup.WithSentAt(d.Timestamp)
}

// settle logs a failed ack, nack or reject. The channel is gone then, and
// RabbitMQ redelivers the message: a charge already committed is skipped.
func settle(log *slog.Logger, err error) {
	if err != nil {
		log.Warn("settle delivery", "error", err)
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
