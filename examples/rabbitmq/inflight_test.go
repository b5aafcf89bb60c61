package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgdedup/pgdedup/examples/internal/fleet"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

// A delivery whose message ID is claimed by a transaction still open elsewhere
// (its first delivery, on another consumer) is requeued, neither charged nor
// acked, for as long as that transaction runs. When it ends, the next
// redelivery settles the message: skipped if the first committed, charged if
// it rolled back. Either way the order is charged once and the queue empties.
func TestInFlightDeliveryIsRequeuedUntilTheFirstEnds(t *testing.T) {
	for _, tc := range []struct {
		name        string
		commit      bool
		wantCharger string
	}{
		{"first commits", true, "first"},
		{"first rolls back", false, "c1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			amqpURL := rabbitURL(t)
			db := fleet.ShopDB(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ch, queue := testQueue(t, amqpURL, rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1)))

			// The first delivery: claimed and charged, not yet committed.
			order := shop.Order{OrderID: "o1", Customer: "c", AmountCents: 990}
			const id = "charge-o1"
			first := fleet.HoldCharge(t, ctx, db, id, order, "first")

			// The duplicate delivery, to a consumer that gives up waiting after 20ms.
			body, _ := json.Marshal(order)
			if err := publish(ctx, ch, queue, []amqp.Publishing{{MessageId: id, DeliveryMode: amqp.Persistent, Body: body}}); err != nil {
				t.Fatal(err)
			}
			out := &fleet.Log{}
			consumeCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- consume(consumeCtx, consumerConfig{
					AMQPURL: amqpURL, DatabaseURL: db.URL, Queue: queue, Name: "c1",
					Prefetch: 1, Workers: 1, LockTimeout: 20 * time.Millisecond, ShutdownTimeout: 10 * time.Second,
					Log: slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug})),
				})
			}()
			out.WaitFor(t, ctx, "3 in-flight requeues", func(n fleet.Counts) bool { return n.InFlight >= 3 })
			if n := out.Counts(); n.Processed+n.Duplicates != 0 {
				t.Fatalf("the duplicate was settled while the first delivery held its ID: %+v", n)
			}

			var err error
			if tc.commit {
				err = first.Commit(ctx)
			} else {
				err = first.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			out.WaitFor(t, ctx, "the message settled", func(n fleet.Counts) bool { return n.Processed+n.Duplicates > 0 })
			stop()
			if err := <-done; err != nil {
				t.Fatalf("consume after SIGTERM-like cancel: %v", err)
			}

			fleet.CheckChargedBy(t, db, map[string][]string{order.OrderID: {tc.wantCharger}})
			if q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil || q.Messages != 0 {
				t.Errorf("queue after the consumer stopped: %d messages, %v; want empty", q.Messages, err)
			}
			t.Logf("in-flight requeues: %d", out.Counts().InFlight)
		})
	}
}
