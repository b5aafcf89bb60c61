package main

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup/examples/internal/fleet"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

// TestHandlerSlowerThanAckWait runs a consumer whose charges take longer than
// AckWait: JetStream redelivers every message while its first delivery is
// still in its transaction, often to another worker of the same process. The
// copy waits LockTimeout on the claim, gets ErrInFlight and is nak'ed; once
// the first commits, the next redelivery is skipped. One charge per order.
func TestHandlerSlowerThanAckWait(t *testing.T) {
	const orders = 20
	url := natsURL(t)
	db := fleet.ShopDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
	ts := newTestStream(t, url, rng, time.Minute)
	msgs, _ := orderBatch{RunID: "slow", Orders: orders}.messages(rng, ts.subject)
	want := map[string]shop.Order{}
	for _, m := range msgs {
		o, _ := shop.DecodeOrder(m.Data)
		want[o.OrderID] = o
	}
	if _, _, err := publish(ctx, ts.js, msgs); err != nil {
		t.Fatal(err)
	}
	p := fleet.Start(t, childEnv, "slow", "-database-url", db.URL, "-nats-url", url, "-stream", ts.stream, "-subject", ts.subject,
		"-durable", ts.durable, "-ack-wait", "1s", "-handler-delay", "1300ms", "-lock-timeout", "300ms", "-workers", "8", "-batch", "16")
	stream, err := ts.js.Stream(ctx, ts.stream)
	if err != nil {
		t.Fatal(err)
	}
	for tick := time.NewTicker(100 * time.Millisecond); ; <-tick.C {
		if ctx.Err() != nil {
			t.Fatalf("not drained: %d of %d orders charged\n%s", fleet.CountCharged(t, db), orders, p.Log.LastLines())
		}
		if !p.Running() {
			t.Fatalf("consumer exited: %v\n%s", p.Err(), p.Log.LastLines())
		}
		info, err := consumerInfo(ctx, stream, ts.durable)
		if err != nil {
			t.Fatal(err)
		}
		if info != nil && fleet.CountCharged(t, db) == orders && info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
	}
	if err := p.Stop(15 * time.Second); err != nil {
		t.Errorf("after SIGTERM: %v\n%s", err, p.Log.LastLines())
	}
	fleet.CheckCharges(t, db, want)
	n := p.Log.Counts()
	t.Logf("%d orders, handler 1.3s, AckWait 1s: %d deliveries logged, %d redelivered, %d in-flight naks, %d duplicates skipped",
		orders, n.Deliveries, n.Redelivered, n.InFlight, n.Duplicates)
	if n.Redelivered == 0 || n.InFlight+n.Duplicates == 0 {
		t.Errorf("no redelivery reached the claim while in flight or after it: AckWait was not exercised")
	}
	if n.Failed > 0 || n.Races > 0 {
		t.Errorf("%d failed deliveries, %d data races", n.Failed, n.Races)
	}
}
