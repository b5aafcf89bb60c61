package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

// outcome is what became of one SQS message, and what to tell SQS: delete
// it (processed, duplicate) or leave it to come back (the others).
type outcome string

const (
	processed outcome = "processed" // charged in this call's transaction: delete
	duplicate outcome = "duplicate" // charged before (a redelivery, a producer's retry): delete
	inFlight  outcome = "in_flight" // its key is held by a transaction still running elsewhere: requeue soon
	failed    outcome = "failed"    // an error a retry can cure: requeue soon
	stopped   outcome = "stopped"   // shutting down: it comes back after the visibility timeout
	rejected  outcome = "rejected"  // can never be charged: left to the queue's redrive policy (DLQ)
)

// done reports whether SQS should forget the message.
func (o outcome) done() bool { return o == processed || o == duplicate }

// message is one SQS message, from ReceiveMessage or from a Lambda event,
// decoded before anything touches the database.
type message struct {
	SQSID        string // the MessageId SQS gave it; Lambda's BatchItemFailures name it
	Key          string // what pgdedup records: the producer's key attribute, else SQSID
	ReceiveCount int    // ApproximateReceiveCount: above 1 it is a redelivery
	Order        shop.Order
	Err          error // not a chargeable order: rejected
	Outcome      outcome
}

// newMessage decodes one message. key is the value of the producer's key
// attribute, empty when the producer set none.
func newMessage(sqsID, key, body string, receiveCount int) *message {
	m := &message{SQSID: sqsID, Key: key, ReceiveCount: receiveCount}
	if m.Key == "" {
		// SQS's own MessageId is the same on every redelivery of one send,
		// but a producer that retries SendMessage makes a new one: only a
		// key the producer chose catches that duplicate.
		m.Key = sqsID
	}
	m.Order, m.Err = shop.DecodeOrder([]byte(body))
	if m.Err == nil {
		m.Err = pgdedup.ValidateMessageID(m.Key)
	}
	return m
}

// charger charges the orders of a batch of SQS messages, each once.
type charger struct {
	store        *pgdedup.Store
	name         string        // recorded in charges.charged_by
	handlerDelay time.Duration // simulated work inside each transaction
	log          *slog.Logger
}

// chargeBatch sets the Outcome of every message of msgs (at most 10: one
// ReceiveMessage or one Lambda event). The valid ones go through one
// ProcessBatch: one transaction claims every key and charges the new ones.
// If that fails (a key in flight elsewhere, a failed charge), each message
// is tried on its own, so that one message does not hold back the others.
func (c *charger) chargeBatch(ctx context.Context, msgs []*message) {
	var keys []string
	byKey := map[string]*message{}
	for _, m := range msgs {
		if m.Err != nil {
			m.Outcome = rejected
			continue
		}
		if byKey[m.Key] == nil {
			byKey[m.Key] = m
		}
		keys = append(keys, m.Key)
	}
	if len(keys) == 0 {
		return
	}
	fresh, err := c.store.ProcessBatch(ctx, keys, func(ctx context.Context, tx pgx.Tx, fresh []string) error {
		for _, key := range fresh {
			if err := shop.Charge(ctx, tx, byKey[key].Order, key, c.name); err != nil {
				return err
			}
		}
		return sleep(ctx, c.handlerDelay)
	})
	if err == nil {
		charged := map[string]bool{}
		for _, key := range fresh {
			charged[key] = true
		}
		for _, m := range msgs {
			if m.Err == nil {
				m.Outcome = duplicate
				if charged[m.Key] && byKey[m.Key] == m {
					m.Outcome = processed
				}
			}
		}
		return
	}
	c.log.Debug("batch failed, trying its messages one by one", "messages", len(keys), "error", err)
	for _, m := range msgs {
		if m.Err == nil {
			m.Outcome, m.Err = c.chargeOne(ctx, m)
		}
	}
}

// chargeOne is chargeBatch for one message; its outcome is what
// pgdedup.ActionFor says of Process's error.
func (c *charger) chargeOne(ctx context.Context, m *message) (outcome, error) {
	charged, err := c.store.Process(ctx, m.Key, func(ctx context.Context, tx pgx.Tx) error {
		if err := shop.Charge(ctx, tx, m.Order, m.Key, c.name); err != nil {
			return err
		}
		return sleep(ctx, c.handlerDelay)
	})
	switch pgdedup.ActionFor(err) {
	case pgdedup.ActionAck:
		if charged {
			return processed, nil
		}
		return duplicate, nil
	case pgdedup.ActionRequeue:
		if errors.Is(err, pgdedup.ErrInFlight) {
			return inFlight, err
		}
		return failed, fmt.Errorf("order %s: %w", m.Order.OrderID, err)
	case pgdedup.ActionStop:
		return stopped, err
	default: // ActionDeadLetter
		return rejected, fmt.Errorf("order %s: %w", m.Order.OrderID, err)
	}
}

// logOutcome writes the per-message debug line the tests count.
func logOutcome(log *slog.Logger, m *message) {
	args := []any{"sqs_message_id", m.SQSID, "key", m.Key, "redelivered", m.ReceiveCount > 1, "outcome", m.Outcome}
	if m.Err != nil {
		args = append(args, "error", m.Err)
	}
	if m.Order.OrderID != "" {
		args = append(args, "order_id", m.Order.OrderID)
	}
	level := slog.LevelDebug
	if m.Outcome == failed || m.Outcome == rejected {
		level = slog.LevelWarn
	}
	log.Log(context.Background(), level, "delivery", args...)
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
