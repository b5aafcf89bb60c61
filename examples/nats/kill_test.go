package main

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgdedup/pgdedup/examples/internal/fleet"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

// TestKilledConsumersChargeEachOrderOnce publishes a few thousand orders to a
// real JetStream stream (some twice at once, which JetStream's duplicate window
// drops; some again after the window, which it stores; some without a
// Nats-Msg-Id; a few unparseable), consumes them with several consumer
// processes sharing one durable pull consumer, SIGKILLs some of them
// mid-processing and starts replacements, and checks once everything is acked
// that every order was charged exactly once, with its own amount.
func TestKilledConsumersChargeEachOrderOnce(t *testing.T) {
	const (
		orders    = 3000
		consumers = 4
		kills     = 6
		dupWindow = time.Second
		ackWait   = 2 * time.Second
	)
	url := natsURL(t)
	db := fleet.ShopDB(t)
	// Not a bound on speed: the fleet fails as stuck only when its state stops
	// changing (fleet.Stall); this only turns a hang into a failure.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	rng := fleet.Rand(t)
	ts := newTestStream(t, url, rng, dupWindow)

	batch := orderBatch{RunID: "t", Orders: orders, Duplicates: 0.1, WithoutID: 0.05}
	msgs, dups := batch.messages(rng, ts.subject)
	want := make(map[string]shop.Order, orders)
	var withID []*nats.Msg
	for _, m := range msgs {
		o, err := shop.DecodeOrder(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		want[o.OrderID] = o
		if m.Header.Get(jetstream.MsgIDHeader) != "" && !slices.Contains(withID, m) { // a duplicate is the same *nats.Msg
			withID = append(withID, m)
		}
	}
	poison := []string{"not json", `{"order_id":"","amount_cents":5}`, `{"order_id":"x","amount_cents":-1}`}
	for _, body := range poison {
		i := rng.IntN(len(msgs))
		msgs = slices.Insert(msgs, i, &nats.Msg{Subject: ts.subject, Data: []byte(body)})
	}
	start := time.Now()
	stored, dropped, err := publish(ctx, ts.js, msgs)
	if err != nil {
		t.Fatal(err)
	}
	// A producer replaying its outbox after the window: JetStream stores these
	// copies again, and only the consumer's dedup stands between them and a
	// second charge.
	time.Sleep(dupWindow + 200*time.Millisecond)
	var late []*nats.Msg
	for _, i := range rng.Perm(len(withID))[:len(withID)/20] {
		late = append(late, withID[i])
	}
	lateStored, lateDropped, err := publish(ctx, ts.js, late)
	if err != nil {
		t.Fatal(err)
	}
	if lateStored != len(late) || lateDropped != 0 {
		t.Fatalf("republished after the window: %d stored, %d dropped; want all %d stored", lateStored, lateDropped, len(late))
	}

	args := []string{"-database-url", db.URL, "-nats-url", url, "-stream", ts.stream, "-subject", ts.subject, "-durable", ts.durable,
		"-ack-wait", ackWait.String(), "-batch", "16", "-workers", "3", "-handler-delay", "8ms", "-lock-timeout", "500ms"}
	g := fleet.NewGroup(t, childEnv, consumers, args...)
	stream, err := ts.js.Stream(ctx, ts.stream)
	if err != nil {
		t.Fatal(err)
	}

	killAt := fleet.KillPoints(rng, kills, orders)
	killed := 0
	stall := fleet.Stall{Limit: time.Minute}
	for tick := time.NewTicker(50 * time.Millisecond); ; <-tick.C {
		charged := fleet.CountCharged(t, db)
		if ctx.Err() != nil || stall.Stuck(charged, g.Counts()) {
			t.Fatalf("stream not drained, no progress for %s: %d orders charged of %d\n%s", stall.Limit, charged, orders, g.LastLines())
		}
		if killed < kills && charged >= killAt[killed] {
			victim := g.KillOne(rng)
			t.Logf("SIGKILL %s at %d/%d orders charged (%d deliveries logged)", victim.Name, charged, orders, victim.Log.Counts().Deliveries)
			killed++
			g.StartOne()
			continue
		}
		g.CheckRunning()
		// The consumer may not exist for the first few ticks.
		info, err := consumerInfo(ctx, stream, ts.durable)
		if err != nil {
			t.Fatal(err)
		}
		// Drained: all charged, nothing left to deliver, nothing unacked (so
		// what the killed processes held has been redelivered and acked).
		if info != nil && charged == orders && info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
	}

	g.StopLive(15 * time.Second) // SIGTERM: finish, ack and exit cleanly
	elapsed := time.Since(start)
	info, err := consumerInfo(ctx, stream, ts.durable)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumPending != 0 || info.NumAckPending != 0 {
		t.Errorf("after all consumers stopped: %d messages pending, %d unacked", info.NumPending, info.NumAckPending)
	}

	fleet.CheckCharges(t, db, want)
	total := g.Counts()
	rolledBack := fleet.CountRolledBack(t, db)
	t.Logf("%d messages published (%d orders, %d of them twice at once, %d unparseable): %d stored, %d dropped by JetStream's %s duplicate window; %d republished after the window, all stored; %s; %d consumer processes, %d SIGKILLed",
		len(msgs), orders, dups, len(poison), stored, dropped, dupWindow, len(late), elapsed.Round(time.Millisecond), len(g.All), killed)
	t.Logf("deliveries logged %d (JetStream redelivered %d: charged %d, skipped as already charged %d), duplicates skipped %d, in-flight naks %d, terminated %d; charges rolled back by kills %d",
		total.Deliveries, total.Redelivered, total.RedeliveredProcessed, total.RedeliveredDuplicates, total.Duplicates, total.InFlight, total.Rejected, rolledBack)

	switch {
	case total.Races > 0:
		t.Errorf("the race detector reported %d data races in consumers", total.Races)
	case total.Failed > 0:
		t.Errorf("%d deliveries failed", total.Failed)
	case dropped == 0:
		t.Errorf("JetStream dropped no duplicate publish: the window was not exercised")
	case total.Duplicates < len(late):
		t.Errorf("%d duplicates skipped, want at least the %d copies stored after the window", total.Duplicates, len(late))
	case killed < kills/2:
		t.Errorf("only %d consumers killed, want at least %d: the stream drained too fast to test crashes", killed, kills/2)
	case total.Redelivered == 0:
		t.Errorf("no message was redelivered: the kills tested nothing")
	case rolledBack == 0:
		t.Errorf("no charge was rolled back: no kill landed inside a transaction")
	case total.Rejected < len(poison):
		t.Errorf("%d deliveries terminated, want at least the %d unparseable ones", total.Rejected, len(poison))
	}
}

// consumerInfo returns the durable consumer's state, or nil before a consumer
// process has created it.
func consumerInfo(ctx context.Context, s jetstream.Stream, durable string) (*jetstream.ConsumerInfo, error) {
	c, err := s.Consumer(ctx, durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}
