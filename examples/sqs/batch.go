package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
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
	SQSID        string    // the MessageId SQS gave it; Lambda's BatchItemFailures name it
	Key          string    // what pgdedup records: the producer's key attribute, else SQSID
	ReceiveCount int       // ApproximateReceiveCount: above 1 it is a redelivery
	SentAt       time.Time // SentTimestamp: when SQS accepted the send; zero if absent
	Order        shop.Order
	Err          error // not a chargeable order: rejected
	Outcome      outcome
}

// newMessage decodes one message. key is the value of the producer's key
// attribute, empty when the producer set none.
func newMessage(sqsID, key, body string, receiveCount int, sentTimestamp string) *message {
	m := &message{SQSID: sqsID, Key: key, ReceiveCount: receiveCount, SentAt: sentAt(sentTimestamp)}
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

// sentAt parses SQS's SentTimestamp attribute (milliseconds since the epoch),
// the time pgdedup.WithSentAt gets. Every receive of one send carries the
// same, so on the partitioned table a claim looks only in the partitions from
// it less Config.SentAtMargin on, and a message older than the Retention gets
// pgdedup.ErrTooLate (left to the redrive policy) rather than being charged
// after its key may have been forgotten. A producer that retries SendMessage
// makes a new send, stamped later: SentAtMargin (an hour by default) must
// cover how long it retries. Absent or unparsable, the claim has no time.
func sentAt(sentTimestamp string) time.Time {
	ms, err := strconv.ParseInt(sentTimestamp, 10, 64)
	if err != nil || ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// sentAtOption is the WithSentAt of a claim of msgs: the earliest of their
// times, which bounds each of them; none if one has no time, since its claim
// must then look everywhere.
func sentAtOption(msgs []*message) pgdedup.Option {
	var first time.Time
	for _, m := range msgs {
		switch {
		case m.Err != nil:
		case m.SentAt.IsZero():
			return nil
		case first.IsZero() || m.SentAt.Before(first):
			first = m.SentAt
		}
	}
	if first.IsZero() {
		return nil
	}
	return pgdedup.WithSentAt(first)
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
	}, sentAtOption(msgs))
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
	}, sentAtOption([]*message{m}))
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
