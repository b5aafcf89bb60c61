package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgdedup/pgdedup/examples/internal/fleet"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// The consumer passes the producer's event time (ce-time), or else
// JetStream's stored time, to pgdedup.WithSentAt: an order stamped now is
// charged, one stamped beyond the Retention (48 h) is terminated as too late,
// one stamped two hours ahead (past the default SentAtMargin) is terminated
// as an invalid time, and one with no ce-time is charged with the stream's
// time. The refused ones are neither charged nor recorded.
func TestMessageTimeReachesTheClaim(t *testing.T) {
	url := natsURL(t)
	db := fleet.ShopDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ts := newTestStream(t, url, rand.New(rand.NewPCG(rand.Uint64(), 2)), time.Minute)

	now := time.Now()
	var msgs []*nats.Msg
	for _, m := range []struct {
		order string
		at    time.Time
	}{{"fresh", now}, {"too-old", now.Add(-49 * time.Hour)}, {"future", now.Add(2 * time.Hour)}, {"unstamped", time.Time{}}} {
		msg := nats.NewMsg(ts.subject)
		msg.Data, _ = json.Marshal(shop.Order{OrderID: m.order, Customer: "c", AmountCents: 100})
		msg.Header.Set(jetstream.MsgIDHeader, "charge-"+m.order)
		if !m.at.IsZero() {
			msg.Header.Set(eventTimeHeader, m.at.Format(time.RFC3339Nano))
		}
		msgs = append(msgs, msg)
	}
	if _, _, err := publish(ctx, ts.js, msgs); err != nil {
		t.Fatal(err)
	}
	out := &fleet.Log{}
	consumeCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- consume(consumeCtx, consumerConfig{
			NATSURL: url, DatabaseURL: db.URL, Stream: ts.stream, Subject: ts.subject, Durable: ts.durable, Name: "c1",
			AckWait: 30 * time.Second, MaxAckPending: 10, Batch: 10, Workers: 1, ShutdownTimeout: 10 * time.Second,
			Log: slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug})),
		})
	}()
	out.WaitFor(t, ctx, "4 deliveries settled", func(n fleet.Counts) bool { return n.Processed+n.Rejected >= 4 })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("consume after cancel: %v", err)
	}
	if n := out.Counts(); n.Processed != 2 || n.Rejected != 2 {
		t.Errorf("processed %d, rejected %d; want 2 and 2 (the stale and the future time)\n%s", n.Processed, n.Rejected, out.LastLines())
	}
	fleet.CheckChargedBy(t, db, map[string][]string{"fresh": {"c1"}, "unstamped": {"c1"}})
	if n := pgdeduptest.Count(t, db.Pool, "SELECT count(*) FROM processed_messages"); n != 2 {
		t.Errorf("processed_messages holds %d IDs, want 2 (the charged ones)", n)
	}
}
