package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup/examples/internal/fleet"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

// A message whose key is claimed by a transaction still open elsewhere (its
// first copy, on another consumer) is neither charged nor deleted: the
// consumer makes it visible again at once with ChangeMessageVisibility, long
// before the queue's 60-second visibility timeout would, for as long as that
// transaction runs. When it ends, the next receive settles the message:
// skipped if the first committed, charged if it rolled back. Either way the
// order is charged once and the queue empties.
func TestInFlightMessageIsRequeuedUntilTheFirstEnds(t *testing.T) {
	for _, tc := range []struct {
		name        string
		commit      bool
		wantCharger string
	}{
		{"first commits", true, "other"},
		{"first rolls back", false, "c1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			endpoint := sqsEndpoint(t)
			db := fleet.ShopDB(t)
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
			defer cancel()
			client := testClient(t, endpoint)
			url, _ := testQueue(t, client, rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2)), 60, 1000)

			order := shop.Order{OrderID: "o1", Customer: "c", AmountCents: 990}
			const key = "charge-o1"
			first := fleet.HoldCharge(t, ctx, db, key, order, "other")
			body, _ := json.Marshal(order)
			if err := send(ctx, client, url, defaultKeyAttribute, []outgoing{{Body: string(body), Key: key}}); err != nil {
				t.Fatal(err)
			}
			out := &fleet.Log{}
			consumeCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- consume(consumeCtx, consumerConfig{
					DatabaseURL: db.URL, Endpoint: endpoint, QueueURL: url, KeyAttribute: defaultKeyAttribute, Name: "c1",
					Pollers: 1, BatchSize: 10, Wait: time.Second, LockTimeout: 20 * time.Millisecond, ShutdownTimeout: 10 * time.Second,
					Log: slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug})),
				})
			}()
			out.WaitFor(t, ctx, "3 in-flight requeues", func(n fleet.Counts) bool { return n.InFlight >= 3 })
			if n := out.Counts(); n.Processed+n.Duplicates != 0 {
				t.Fatalf("the message was settled while the first copy held its key: %+v", n)
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
			if visible, hidden, err := queueDepth(ctx, client, url); err != nil || visible+hidden != 0 {
				t.Errorf("queue after the consumer stopped: %d visible, %d in flight, %v; want empty", visible, hidden, err)
			}
			t.Logf("in-flight requeues: %d", out.Counts().InFlight)
		})
	}
}
