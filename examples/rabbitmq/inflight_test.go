package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/examples/internal/fleet"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
	"github.com/pgdedup/pgdedup/pgdeduptest"
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
			db := pgdeduptest.New(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := shop.Migrate(ctx, db.Pool); err != nil {
				t.Fatal(err)
			}
			ch, queue := testQueue(t, amqpURL, rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1)))

			// The first delivery: claimed and charged, not yet committed.
			order := shop.Order{OrderID: "o1", Customer: "c", AmountCents: 990}
			const id = "charge-o1"
			store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing"})
			if err != nil {
				t.Fatal(err)
			}
			first, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer first.Rollback(ctx) //nolint:errcheck // no-op after Commit
			if claimed, err := store.Claim(ctx, first, id); err != nil || !claimed {
				t.Fatalf("Claim = %t, %v", claimed, err)
			}
			if err := shop.Charge(ctx, first, order, id, "first"); err != nil {
				t.Fatal(err)
			}

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
			waitFor(t, ctx, out, "3 in-flight requeues", func(n fleet.Counts) bool { return n.InFlight >= 3 })
			if n := out.Counts(); n.Processed+n.Duplicates != 0 {
				t.Fatalf("the duplicate was settled while the first delivery held its ID: %+v", n)
			}

			if tc.commit {
				err = first.Commit(ctx)
			} else {
				err = first.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, ctx, out, "the message settled", func(n fleet.Counts) bool { return n.Processed+n.Duplicates > 0 })
			stop()
			if err := <-done; err != nil {
				t.Fatalf("consume after SIGTERM-like cancel: %v", err)
			}

			rows, _ := db.Pool.Query(ctx, "SELECT charged_by FROM charges WHERE order_id = $1", order.OrderID)
			chargers, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			if len(chargers) != 1 || chargers[0] != tc.wantCharger {
				t.Errorf("order charged by %q, want once by %q", chargers, tc.wantCharger)
			}
			if q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil || q.Messages != 0 {
				t.Errorf("queue after the consumer stopped: %d messages, %v; want empty", q.Messages, err)
			}
			t.Logf("in-flight requeues: %d", out.Counts().InFlight)
		})
	}
}

// waitFor polls out until cond holds, failing the test when ctx ends first.
func waitFor(t *testing.T, ctx context.Context, out *fleet.Log, what string, cond func(fleet.Counts) bool) {
	t.Helper()
	for !cond(out.Counts()) {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v; consumer log:\n%s", what, ctx.Err(), out.LastLines())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
