package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

// declareQueue declares the orders queue, durable so that persistent messages
// survive a broker restart. Producer and consumer both declare it, with the
// same arguments, so either may start first.
func declareQueue(ch *amqp.Channel, queue string) error {
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare queue %s: %w", queue, err)
	}
	return nil
}

// orderBatch describes the messages a producer sends in one run.
type orderBatch struct {
	RunID      string  // makes order IDs unique across runs
	Orders     int     // distinct orders
	Duplicates float64 // share of orders published a second time, as a producer retrying after a lost confirm does
	WithoutID  float64 // share of orders published without a MessageId: the consumer keys them by content
}

// messages returns the batch's messages and how many are duplicates. A
// duplicate is the same order with the same MessageId (or, without one, the
// same body); half of them follow their original at once, as a producer
// retrying a publish whose confirm timed out, so two consumers handle both
// copies at the same time; the others come later, anywhere in the batch.
func (b orderBatch) messages(rng *rand.Rand) (msgs []amqp.Publishing, duplicates int) {
	type keyed struct {
		at  float64 // position in the batch
		msg amqp.Publishing
	}
	var all []keyed
	for i := range b.Orders {
		o := shop.Order{
			OrderID:     fmt.Sprintf("ord-%s-%06d", b.RunID, i),
			Customer:    fmt.Sprintf("cust-%04d", rng.IntN(1000)),
			AmountCents: 100 + rng.Int64N(100_000),
		}
		body, _ := json.Marshal(o) // cannot fail: strings and an int
		msg := amqp.Publishing{
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			Body:         body,
			// Stamped once per order: the consumer passes it to WithSentAt.
			Timestamp: time.Now(),
		}
		if rng.Float64() >= b.WithoutID {
			msg.MessageId = "charge-" + o.OrderID
		}
		all = append(all, keyed{float64(i), msg})
		if rng.Float64() < b.Duplicates {
			at := float64(i) + 0.5
			if rng.IntN(2) == 0 {
				at = float64(i) + rng.Float64()*float64(b.Orders-i)
			}
			all = append(all, keyed{at, msg})
			duplicates++
		}
	}
	slices.SortStableFunc(all, func(x, y keyed) int { return cmp.Compare(x.at, y.at) })
	for _, k := range all {
		msgs = append(msgs, k.msg)
	}
	return msgs, duplicates
}

// publish sends msgs to queue on the default exchange with publisher confirms
// and returns once RabbitMQ has confirmed every one (stored, for persistent
// messages on a durable queue).
func publish(ctx context.Context, ch *amqp.Channel, queue string, msgs []amqp.Publishing) error {
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for i, msg := range msgs {
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, msg)
		if err != nil {
			return fmt.Errorf("publish message %d: %w", i, err)
		}
		confirms = append(confirms, c)
	}
	for i, c := range confirms {
		acked, err := c.WaitContext(ctx)
		if err != nil {
			return fmt.Errorf("confirm message %d: %w", i, err)
		}
		if !acked {
			return fmt.Errorf("RabbitMQ refused message %d", i)
		}
	}
	return nil
}
