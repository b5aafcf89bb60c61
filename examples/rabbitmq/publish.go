package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"

	amqp "github.com/rabbitmq/amqp091-go"
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

// messages returns the batch's messages in a random order, duplicates mixed
// in, and how many are duplicates. A duplicate is the same order with the same
// MessageId (or, without one, the same body).
func (b orderBatch) messages(rng *rand.Rand) (msgs []amqp.Publishing, duplicates int) {
	for i := range b.Orders {
		o := Order{
			OrderID:     fmt.Sprintf("ord-%s-%06d", b.RunID, i),
			Customer:    fmt.Sprintf("cust-%04d", rng.IntN(1000)),
			AmountCents: 100 + rng.Int64N(100_000),
		}
		body, _ := json.Marshal(o) // cannot fail: strings and an int
		msg := amqp.Publishing{
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			Body:         body,
		}
		if rng.Float64() >= b.WithoutID {
			msg.MessageId = "charge-" + o.OrderID
		}
		msgs = append(msgs, msg)
		if rng.Float64() < b.Duplicates {
			msgs = append(msgs, msg)
			duplicates++
		}
	}
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
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
