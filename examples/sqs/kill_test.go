package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/examples/internal/fleet"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// TestKilledConsumersChargeEachOrderOnce sends a few thousand orders (some
// twice with the same key attribute, some without one, a few unparseable) to
// a real SQS-compatible queue with a short visibility timeout and a
// dead-letter queue, consumes them with several consumer processes,
// SIGKILLs some of them mid-batch and starts replacements, and checks once
// the queue has drained that every order was charged exactly once with its
// own amount, that none was lost (nothing valid in the dead-letter queue), and
// that the kills caused redeliveries after the visibility timeout.
func TestKilledConsumersChargeEachOrderOnce(t *testing.T) {
	const (
		orders      = 300
		consumers   = 4
		kills       = 6
		visibility  = 5 // seconds
		maxReceives = 6
	)
	endpoint := sqsEndpoint(t)
	db := fleet.ShopDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	rng := fleet.Rand(t)

	client := testClient(t, endpoint)
	url, dlq := testQueue(t, client, rng, visibility, maxReceives)
	batch := orderBatch{RunID: "t", Orders: orders, Duplicates: 0.1, WithoutKey: 0.05, KeyAttribute: defaultKeyAttribute}
	poison := []string{"not json", `{"order_id":"","amount_cents":5}`, `{"order_id":"x","amount_cents":-1}`}
	want, sent, dups := sendOrders(t, ctx, client, url, rng, batch, poison)

	start := time.Now()
	args := []string{"-database-url", db.URL, "-endpoint", endpoint, "-queue-url", url,
		"-pollers", "2", "-batch", "10", "-wait", "1s", "-handler-delay", "150ms",
		"-lock-timeout", "500ms", "-requeue-delay", "1s"}
	g := fleet.NewGroup(t, childEnv, consumers, args...)

	killAt := fleet.KillPoints(rng, kills, orders)
	killed := 0
	for tick := time.NewTicker(100 * time.Millisecond); ; <-tick.C {
		if ctx.Err() != nil {
			t.Fatalf("queue not drained after %s: %d orders charged of %d\n%s", time.Since(start), fleet.CountCharged(t, db), orders, g.LastLines())
		}
		charged := fleet.CountCharged(t, db)
		if killed < kills && charged >= killAt[killed] {
			victim := killInTransaction(t, db, g, rng)
			t.Logf("SIGKILL %s at %d/%d orders charged (%d messages logged)", victim.Name, charged, orders, victim.Log.Counts().Deliveries)
			killed++
			g.StartOne()
			continue
		}
		g.CheckRunning()
		if charged < orders {
			continue
		}
		// Drained: all charged, every message deleted, and the poison ones
		// moved to the dead-letter queue by the redrive policy.
		if charged == orders && drained(t, ctx, client, url, dlq, len(poison)) {
			break
		}
	}

	g.StopLive(15 * time.Second) // SIGTERM: finish, delete and exit cleanly
	elapsed := time.Since(start)

	fleet.CheckCharges(t, db, want)
	checkDeadLetters(t, client, dlq, poison)
	total := g.Counts()
	rolledBack := fleet.CountRolledBack(t, db)
	t.Logf("%d messages (%d orders, %d sent twice, %d unparseable) in %s; %d consumer processes, %d SIGKILLed",
		sent, orders, dups, len(poison), elapsed.Round(time.Millisecond), len(g.All), killed)
	t.Logf("messages logged %d, redelivered %d (charged %d, skipped as already charged %d), in-flight requeues %d, rejected %d; charges rolled back by kills %d",
		total.Deliveries, total.Redelivered, total.RedeliveredProcessed, total.RedeliveredDuplicates, total.InFlight, total.Rejected, rolledBack)

	switch {
	case total.Races > 0:
		t.Errorf("the race detector reported %d data races in consumers", total.Races)
	case total.Failed > 0:
		t.Errorf("%d messages failed", total.Failed)
	case killed < kills/2:
		t.Errorf("only %d consumers killed, want at least %d: the queue drained too fast to test crashes", killed, kills/2)
	case total.RedeliveredProcessed+total.RedeliveredDuplicates == 0:
		t.Errorf("no valid message was redelivered: the kills tested nothing")
	case rolledBack == 0:
		t.Errorf("no charge was rolled back: no kill landed inside a transaction")
	case total.Rejected < len(poison):
		t.Errorf("%d messages rejected, want at least the %d unparseable ones", total.Rejected, len(poison))
	}
}

// sendOrders sends batch's messages to url, with the poison bodies
// (unparseable orders, sent without a key) at random places among them. It
// returns the orders sent by ID, how many messages went out, and how many
// orders were sent twice.
func sendOrders(t *testing.T, ctx context.Context, client *sqs.Client, url string, rng *rand.Rand, batch orderBatch, poison []string) (want map[string]shop.Order, sent, dups int) {
	t.Helper()
	msgs, dups := batch.messages(rng)
	want = make(map[string]shop.Order, batch.Orders)
	for _, m := range msgs {
		o, err := shop.DecodeOrder([]byte(m.Body))
		if err != nil {
			t.Fatal(err)
		}
		want[o.OrderID] = o
	}
	for _, body := range poison {
		msgs = slices.Insert(msgs, rng.IntN(len(msgs)), outgoing{Body: body})
	}
	if err := send(ctx, client, url, batch.KeyAttribute, msgs); err != nil {
		t.Fatal(err)
	}
	return want, len(msgs), dups
}

// drained reports whether every message of url has been deleted and at
// least poison messages moved to the dead-letter queue dlq by the redrive
// policy.
func drained(t *testing.T, ctx context.Context, client *sqs.Client, url, dlq string, poison int) bool {
	t.Helper()
	visible, hidden, err := queueDepth(ctx, client, url)
	if err != nil {
		t.Fatal(err)
	}
	dead, _, err := queueDepth(ctx, client, dlq)
	if err != nil {
		t.Fatal(err)
	}
	return visible == 0 && hidden == 0 && dead >= poison
}

// checkDeadLetters empties the dead-letter queue dlq and asserts that it
// held the poison bodies and nothing else: no valid order was given up.
func checkDeadLetters(t *testing.T, client *sqs.Client, dlq string, poison []string) {
	t.Helper()
	got := receiveAll(t, client, dlq)
	slices.Sort(got)
	want := slices.Sorted(slices.Values(poison))
	if !slices.Equal(got, want) {
		t.Errorf("dead-letter queue holds %q, want only the unparseable messages %q", got, want)
	}
}

// receiveAll receives every message of the queue, deletes it, and returns
// their bodies.
func receiveAll(t *testing.T, client *sqs.Client, url string) []string {
	t.Helper()
	ctx := context.Background()
	var bodies []string
	for {
		out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &url, MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) == 0 {
			return bodies
		}
		for _, m := range out.Messages {
			bodies = append(bodies, aws.ToString(m.Body))
			if _, err := client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: &url, ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(fmt.Errorf("delete: %w", err))
			}
		}
	}
}

// killInTransaction SIGKILLs a live consumer while it holds a transaction
// open for at least 50ms (its charges are inserted then, and it sleeps the
// -handler-delay before COMMIT), so that the kill rolls charges back. It
// kills a random one if none is in a transaction for 10 seconds.
func killInTransaction(t *testing.T, db *pgdeduptest.DB, g *fleet.Group, rng *rand.Rand) *fleet.Proc[*fleet.Log] {
	t.Helper()
	var names []string
	for _, p := range g.Live {
		names = append(names, p.Name)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var name string
		err := db.Pool.QueryRow(context.Background(), `SELECT application_name FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = ANY($1)
			  AND xact_start < clock_timestamp() - interval '50 ms' LIMIT 1`, names).Scan(&name)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		i := slices.Index(names, name)
		victim := g.Live[i]
		victim.Kill()
		g.Live = slices.Delete(g.Live, i, i+1)
		return victim
	}
	return g.KillOne(rng)
}
