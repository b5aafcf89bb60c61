package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

// consumerConfig is what one consumer process needs; main fills it from flags
// and environment variables.
type consumerConfig struct {
	NATSURL         string
	DatabaseURL     string
	Stream          string
	Subject         string
	Durable         string        // the durable consumer all processes share
	Name            string        // this process, recorded in charges.charged_by and the NATS connection name
	AckWait         time.Duration // JetStream redelivers a message not acked within this
	MaxAckPending   int           // messages out unacked at once, over all processes
	Batch           int           // messages this process buffers ahead (PullMaxMessages)
	Workers         int           // messages processed concurrently
	LockTimeout     time.Duration // pgdedup.Config.LockTimeout: give up on a duplicate still in flight elsewhere
	HandlerDelay    time.Duration // simulated work inside the transaction, e.g. a call to a payment API
	ShutdownTimeout time.Duration // how long SIGTERM waits for messages being processed
	Log             *slog.Logger
}

// consume runs a consumer until ctx is cancelled (SIGTERM). On cancel it stops
// pulling, finishes and acks the messages it already holds, then closes;
// anything left unacked (a timeout, a crash) JetStream redelivers after
// AckWait, and pgdedup skips what had already committed.
func consume(ctx context.Context, cfg consumerConfig) error {
	pool, store, err := shop.OpenStore(ctx, cfg.DatabaseURL, cfg.Workers, cfg.LockTimeout, cfg.Log)
	if err != nil {
		return err
	}
	defer pool.Close()

	nc, err := nats.Connect(cfg.NATSURL, nats.Name(cfg.Name))
	if err != nil {
		return fmt.Errorf("connect to NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	s, err := ensureStream(ctx, js, cfg.Stream, cfg.Subject, defaultDupWindow)
	if err != nil {
		return err
	}
	cons, err := ensureConsumer(ctx, s, cfg.Durable, cfg.AckWait, cfg.MaxAckPending)
	if err != nil {
		return err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(cfg.Batch))
	if err != nil {
		return fmt.Errorf("pull from %s: %w", cfg.Durable, err)
	}
	cfg.Log.Info("consuming", "stream", cfg.Stream, "durable", cfg.Durable, "ack_wait", cfg.AckWait, "workers", cfg.Workers)

	// Workers keep going after ctx is cancelled: a transaction half done at
	// SIGTERM is finished and acked rather than thrown away.
	c := &consumer{cfg: cfg, store: store}
	workCtx := context.WithoutCancel(ctx)
	msgs := make(chan jetstream.Msg)
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Go(func() {
			for m := range msgs {
				c.handle(workCtx, m)
			}
		})
	}
	stop := context.AfterFunc(ctx, func() {
		cfg.Log.Info("shutting down: no new messages, finishing the ones held")
		it.Drain() // Next hands out what is buffered, then ErrMsgIteratorClosed
	})
	defer stop()
	var pullErr error
pull:
	for {
		m, err := it.Next()
		switch {
		case err == nil:
			msgs <- m
		case errors.Is(err, jetstream.ErrNoHeartbeat):
			// The server's heartbeats were late (a busy machine, a network
			// blip); the iterator issues a new pull request and goes on.
			cfg.Log.Warn("pull: missed heartbeats", "error", err)
		case errors.Is(err, nats.ErrConnectionClosed): // reconnects gave up
			pullErr = fmt.Errorf("NATS connection lost: %w", err)
			break pull
		case errors.Is(err, jetstream.ErrMsgIteratorClosed): // drained after SIGTERM
			break pull
		default: // the consumer was deleted, or the server refused the pull
			pullErr = fmt.Errorf("pull: %w", err)
			it.Stop()
			break pull
		}
	}
	close(msgs)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(cfg.ShutdownTimeout):
		return fmt.Errorf("shutdown: messages still in flight after %s; JetStream redelivers them", cfg.ShutdownTimeout)
	}
	c.log("stopped")
	return pullErr
}

// consumer charges orders from a JetStream consumer, each message once.
type consumer struct {
	cfg                                               consumerConfig
	store                                             *pgdedup.Store
	mu                                                sync.Mutex
	processed, duplicates, inFlight, failed, rejected int
}

// handle processes one message and settles it as pgdedup.ActionFor says: ack
// when its charge is committed or it is a duplicate, nak (redeliver later)
// when it may succeed then, leave it when shutting down, term when it never
// can.
func (c *consumer) handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil { // not a JetStream message: cannot happen on a pull consumer
		c.cfg.Log.Error("delivery", "outcome", "failed", "error", err)
		return
	}
	id := messageID(msg, meta)
	log := c.cfg.Log.With("message_id", id, "seq", meta.Sequence.Stream, "redelivered", meta.NumDelivered > 1)
	order, err := shop.DecodeOrder(msg.Data())
	if err == nil {
		err = pgdedup.ValidateMessageID(id)
	}
	if err != nil {
		log.Warn("delivery", "outcome", "rejected", "error", err)
		c.count(&c.rejected)
		settle(log, msg.Term()) // never redelivered; an advisory tells monitoring
		return
	}

	processed, err := c.store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
		if err := shop.Charge(ctx, tx, order, id, c.cfg.Name); err != nil {
			return err
		}
		return sleep(ctx, c.cfg.HandlerDelay)
	}, pgdedup.WithSentAt(sentAt(msg, meta)))
	switch pgdedup.ActionFor(err) {
	case pgdedup.ActionAck:
		settle(log, msg.Ack()) // a duplicate is done too: ack, or it comes back after every AckWait
		if processed {
			log.Debug("delivery", "outcome", "processed", "order_id", order.OrderID)
			c.count(&c.processed)
		} else {
			log.Debug("delivery", "outcome", "duplicate", "order_id", order.OrderID)
			c.count(&c.duplicates)
		}
	case pgdedup.ActionRequeue:
		if errors.Is(err, pgdedup.ErrInFlight) {
			// Another delivery of the same message holds the claim (AckWait ran
			// out while it was still being processed, or a producer published it
			// twice): redeliver this one later, when it is skipped (that one
			// committed) or processed (it failed).
			log.Debug("delivery", "outcome", "in_flight", "order_id", order.OrderID)
			c.count(&c.inFlight)
			settle(log, msg.NakWithDelay(c.cfg.LockTimeout))
			return
		}
		log.Error("delivery", "outcome", "failed", "order_id", order.OrderID, "error", err)
		c.count(&c.failed)
		settle(log, msg.NakWithDelay(time.Second)) // don't spin on a database that is down
	case pgdedup.ActionStop:
		// Shutting down: left unacked, JetStream redelivers it after AckWait.
		log.Info("delivery", "outcome", "stopped", "order_id", order.OrderID, "error", err)
	case pgdedup.ActionDeadLetter:
		log.Warn("delivery", "outcome", "rejected", "order_id", order.OrderID, "error", err)
		c.count(&c.rejected)
		settle(log, msg.Term()) // never redelivered; an advisory tells monitoring
	}
}

// settle logs a failed ack, nak or term. JetStream then redelivers the message
// after AckWait: a charge already committed is skipped.
func settle(log *slog.Logger, err error) {
	if err != nil {
		log.Warn("settle message", "error", err)
	}
}

func (c *consumer) count(n *int) {
	c.mu.Lock()
	*n++
	c.mu.Unlock()
}

func (c *consumer) log(msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cfg.Log.Info(msg, "processed", c.processed, "duplicates", c.duplicates, "in_flight", c.inFlight,
		"failed", c.failed, "rejected", c.rejected)
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
