package main

import (
	"context"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgdedup/pgdedup/examples/internal/fleet"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

// TestKilledConsumersChargeEachOrderOnce publishes a few thousand orders
// (some twice with the same MessageId, some without one, a few unparseable) to
// a real RabbitMQ queue, consumes them with several consumer processes,
// SIGKILLs some of them mid-processing and starts replacements, and checks
// once the queue has drained that every order was charged exactly once, with
// its own amount, and that every delivery was settled.
func TestKilledConsumersChargeEachOrderOnce(t *testing.T) {
	const (
		orders    = 3000
		consumers = 4
		kills     = 6
	)
	amqpURL := rabbitURL(t)
	db := fleet.ShopDB(t)
	// Not a bound on speed: the fleet fails as stuck only when its state stops
	// changing (fleet.Stall); this only turns a hang into a failure.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	rng := fleet.Rand(t)

	ch, queue := testQueue(t, amqpURL, rng)
	batch := orderBatch{RunID: "t", Orders: orders, Duplicates: 0.1, WithoutID: 0.05}
	msgs, dups := batch.messages(rng)
	want := make(map[string]shop.Order, orders)
	for _, m := range msgs {
		o, err := shop.DecodeOrder(m.Body)
		if err != nil {
			t.Fatal(err)
		}
		want[o.OrderID] = o
	}
	poison := [][]byte{[]byte("not json"), []byte(`{"order_id":"","amount_cents":5}`), []byte(`{"order_id":"x","amount_cents":-1}`)}
	for _, body := range poison {
		i := rng.IntN(len(msgs))
		msgs = slices.Insert(msgs, i, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body})
	}
	if err := publish(ctx, ch, queue, msgs); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	args := []string{"-database-url", db.URL, "-amqp-url", amqpURL, "-queue", queue,
		"-prefetch", "16", "-workers", "3", "-handler-delay", "8ms", "-lock-timeout", "500ms"}
	g := fleet.NewGroup(t, childEnv, consumers, args...)

	killAt := fleet.KillPoints(rng, kills, orders)
	killed := 0
	stall := fleet.Stall{Limit: time.Minute}
	for tick := time.NewTicker(50 * time.Millisecond); ; <-tick.C {
		charged := fleet.CountCharged(t, db)
		if ctx.Err() != nil || stall.Stuck(charged, g.Counts()) {
			t.Fatalf("queue not drained, no progress for %s: %d orders charged of %d\n%s", stall.Limit, charged, orders, g.LastLines())
		}
		if killed < kills && charged >= killAt[killed] {
			victim := g.KillOne(rng)
			t.Logf("SIGKILL %s at %d/%d orders charged (%d deliveries logged)", victim.Name, charged, orders, victim.Log.Counts().Deliveries)
			killed++
			g.StartOne()
			continue
		}
		g.CheckRunning()
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Drained: all charged, nothing ready, and RabbitMQ has dropped the
		// killed consumers (so it has requeued what they held).
		if charged == orders && q.Messages == 0 && q.Consumers == len(g.Live) {
			break
		}
	}

	g.StopLive(15 * time.Second) // SIGTERM: finish, ack and exit cleanly
	elapsed := time.Since(start)
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != 0 {
		t.Errorf("%d messages left in the queue after all consumers stopped: some delivery was never acked or rejected", q.Messages)
	}

	fleet.CheckCharges(t, db, want)
	total := g.Counts()
	rolledBack := fleet.CountRolledBack(t, db)
	t.Logf("%d messages (%d orders, %d published twice, %d unparseable) in %s; %d consumer processes, %d SIGKILLed",
		len(msgs), orders, dups, len(poison), elapsed.Round(time.Millisecond), len(g.All), killed)
	t.Logf("deliveries logged %d, redelivered %d (charged %d, skipped as already charged %d), in-flight requeues %d, rejected %d; charges rolled back by kills %d",
		total.Deliveries, total.Redelivered, total.RedeliveredProcessed, total.RedeliveredDuplicates, total.InFlight, total.Rejected, rolledBack)

	switch {
	case total.Races > 0:
		t.Errorf("the race detector reported %d data races in consumers", total.Races)
	case total.Failed > 0:
		t.Errorf("%d deliveries failed", total.Failed)
	case killed < kills/2:
		t.Errorf("only %d consumers killed, want at least %d: the queue drained too fast to test crashes", killed, kills/2)
	case total.Redelivered == 0:
		t.Errorf("no delivery was redelivered: the kills tested nothing")
	case rolledBack == 0:
		t.Errorf("no charge was rolled back: no kill landed inside a transaction")
	case total.Rejected < len(poison):
		t.Errorf("%d deliveries rejected, want at least the %d unparseable ones", total.Rejected, len(poison))
	}
}
