package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

// orderBatch describes the messages a producer sends in one run.
type orderBatch struct {
	RunID      string  // makes order IDs unique across runs
	Orders     int     // distinct orders
	Duplicates float64 // share of orders published a second time at once, as a producer retrying after a lost PubAck does
	WithoutID  float64 // share of orders published without a Nats-Msg-Id: the consumer keys them by stream sequence
}

// messages returns one message per order, in order, and after each order
// chosen as a duplicate (only those with a Nats-Msg-Id: without one a second
// publish is a different message) a second copy with the same Nats-Msg-Id.
func (b orderBatch) messages(rng *rand.Rand, subject string) (msgs []*nats.Msg, duplicates int) {
	for i := range b.Orders {
		o := shop.Order{
			OrderID:     fmt.Sprintf("ord-%s-%06d", b.RunID, i),
			Customer:    fmt.Sprintf("cust-%04d", rng.IntN(1000)),
			AmountCents: 100 + rng.Int64N(100_000),
		}
		body, _ := json.Marshal(o) // cannot fail: strings and an int
		msg := nats.NewMsg(subject)
		msg.Data = body
		if rng.Float64() < b.WithoutID {
			msgs = append(msgs, msg)
			continue
		}
		msg.Header.Set(jetstream.MsgIDHeader, "charge-"+o.OrderID)
		// The order's own time, set once: a second publish keeps it.
		msg.Header.Set(eventTimeHeader, time.Now().UTC().Format(time.RFC3339Nano))
		msgs = append(msgs, msg)
		if rng.Float64() < b.Duplicates {
			msgs = append(msgs, msg)
			duplicates++
		}
	}
	return msgs, duplicates
}

// publish sends msgs and waits for each PubAck: the message is stored (or,
// PubAck.Duplicate, dropped because the stream already has its Nats-Msg-Id
// within its duplicate window).
func publish(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg) (stored, dropped int, err error) {
	for i, msg := range msgs {
		ack, err := js.PublishMsg(ctx, msg)
		if err != nil {
			return stored, dropped, fmt.Errorf("publish message %d: %w", i, err)
		}
		if ack.Duplicate {
			dropped++
		} else {
			stored++
		}
	}
	return stored, dropped, nil
}
