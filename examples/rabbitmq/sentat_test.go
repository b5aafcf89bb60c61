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
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// The consumer passes the message's timestamp property to pgdedup.WithSentAt:
// a message stamped now is charged, one stamped beyond the Retention (48 h)
// is dead-lettered as too late (its ID may have been forgotten), and one
// stamped two hours ahead, past the default SentAtMargin of an hour, is
// dead-lettered as an invalid time. Neither of the last two is charged or
// recorded; a message with no timestamp is charged as before.
func TestMessageTimestampReachesTheClaim(t *testing.T) {
	amqpURL := rabbitURL(t)
	db := fleet.ShopDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch, queue := testQueue(t, amqpURL, rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2)))

	now := time.Now()
	var msgs []amqp.Publishing
	for _, m := range []struct {
		order string
		at    time.Time
	}{{"fresh", now}, {"too-old", now.Add(-49 * time.Hour)}, {"future", now.Add(2 * time.Hour)}, {"unstamped", time.Time{}}} {
		body, _ := json.Marshal(shop.Order{OrderID: m.order, Customer: "c", AmountCents: 100})
		msgs = append(msgs, amqp.Publishing{MessageId: "charge-" + m.order, DeliveryMode: amqp.Persistent, Body: body, Timestamp: m.at})
	}
	if err := publish(ctx, ch, queue, msgs); err != nil {
		t.Fatal(err)
	}
	out := &fleet.Log{}
	consumeCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- consume(consumeCtx, consumerConfig{
			AMQPURL: amqpURL, DatabaseURL: db.URL, Queue: queue, Name: "c1",
			Prefetch: 1, Workers: 1, ShutdownTimeout: 10 * time.Second,
			Log: slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug})),
		})
	}()
	out.WaitFor(t, ctx, "4 deliveries settled", func(n fleet.Counts) bool { return n.Processed+n.Rejected >= 4 })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("consume after cancel: %v", err)
	}
	if n := out.Counts(); n.Processed != 2 || n.Rejected != 2 {
		t.Errorf("processed %d, rejected %d; want 2 and 2 (the stale and the future timestamp)\n%s", n.Processed, n.Rejected, out.LastLines())
	}
	fleet.CheckChargedBy(t, db, map[string][]string{"fresh": {"c1"}, "unstamped": {"c1"}})
	if n := pgdeduptest.Count(t, db.Pool, "SELECT count(*) FROM processed_messages"); n != 2 {
		t.Errorf("processed_messages holds %d IDs, want 2 (the charged ones)", n)
	}
}
