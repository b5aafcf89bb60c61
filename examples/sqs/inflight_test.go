package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/examples/internal/fleet"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
	"github.com/pgdedup/pgdedup/internal/pgtest"
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
			db := pgtest.New(t)
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
			defer cancel()
			if err := shop.Migrate(ctx, db.Pool); err != nil {
				t.Fatal(err)
			}
			client := testClient(t, endpoint)
			url, _ := testQueue(t, client, rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2)), 60, 1000)

			order := shop.Order{OrderID: "o1", Customer: "c", AmountCents: 990}
			const key = "charge-o1"
			first := holdClaim(t, ctx, db, key, order)
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
			waitFor(t, ctx, out, "3 in-flight requeues", func(n fleet.Counts) bool { return n.InFlight >= 3 })
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
			if visible, hidden, err := queueDepth(ctx, client, url); err != nil || visible+hidden != 0 {
				t.Errorf("queue after the consumer stopped: %d visible, %d in flight, %v; want empty", visible, hidden, err)
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
