package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/examples/internal/fleet"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// TestLambdaHandlerOnRealEventPayloads calls the Lambda handler with SQS
// event payloads in the JSON Lambda sends (testdata/): a first batch, the
// same batch redelivered, and a batch with a partial failure. Only the
// failed messages come back in BatchItemFailures; duplicates are
// acknowledged; every order is charged once.
func TestLambdaHandlerOnRealEventPayloads(t *testing.T) {
	db := fleet.ShopDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A charge that fails in the database: the ledger refuses blocked customers.
	if _, err := db.Pool.Exec(ctx, `ALTER TABLE charges ADD CONSTRAINT not_blocked CHECK (customer <> 'blocked')`); err != nil {
		t.Fatal(err)
	}
	out := &fleet.Log{}
	h := newTestHandler(t, db, 50*time.Millisecond, out)

	// The first batch: order a (sent twice by a retrying producer, same
	// key, two SQS MessageIds) and order b (no key: keyed by MessageId).
	event := loadEvent(t, "testdata/sqs-event.json")
	if failures := invoke(t, ctx, h, event); len(failures) != 0 {
		t.Fatalf("first batch: BatchItemFailures %v, want none", failures)
	}
	fleet.CheckChargedBy(t, db, map[string][]string{"ord-a": {"lambda"}, "ord-b": {"lambda"}})

	// SQS redelivers the whole batch (the invocation timed out after the
	// commit, say): every message is a duplicate, acknowledged.
	for i := range event.Records {
		event.Records[i].Attributes["ApproximateReceiveCount"] = "2"
	}
	if failures := invoke(t, ctx, h, event); len(failures) != 0 {
		t.Fatalf("redelivered batch: BatchItemFailures %v, want none (duplicates are done)", failures)
	}
	fleet.CheckChargedBy(t, db, map[string][]string{"ord-a": {"lambda"}, "ord-b": {"lambda"}})

	// A partial failure: c is fine; d is not JSON; e is for a blocked
	// customer (its charge fails); f is being charged by another invocation
	// right now (its key is claimed by an open transaction).
	partial := loadEvent(t, "testdata/sqs-event-partial.json")
	id := map[string]string{}
	for i, o := range []string{"ord-c", "ord-d", "ord-e", "ord-f"} {
		id[o] = partial.Records[i].MessageId
	}
	other := fleet.HoldCharge(t, ctx, db, "charge-ord-f", shop.Order{OrderID: "ord-f", Customer: "cust-0006", AmountCents: 3100}, "other")
	failures := invoke(t, ctx, h, partial)
	want := []string{id["ord-d"], id["ord-e"], id["ord-f"]}
	slices.Sort(failures)
	slices.Sort(want)
	if !slices.Equal(failures, want) {
		t.Fatalf("partial batch: BatchItemFailures %v, want d, e and f %v\n%s", failures, want, out.LastLines())
	}
	fleet.CheckChargedBy(t, db, map[string][]string{"ord-a": {"lambda"}, "ord-b": {"lambda"}, "ord-c": {"lambda"}})

	// The other invocation commits; SQS redelivers the three failures. f is
	// a duplicate now (acknowledged), d and e fail again (d goes to the
	// dead-letter queue after maxReceiveCount).
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	partial.Records = slices.DeleteFunc(partial.Records, func(r events.SQSMessage) bool { return r.MessageId == id["ord-c"] })
	for i := range partial.Records {
		partial.Records[i].Attributes["ApproximateReceiveCount"] = "2"
	}
	failures = invoke(t, ctx, h, partial)
	want = []string{id["ord-d"], id["ord-e"]}
	slices.Sort(failures)
	slices.Sort(want)
	if !slices.Equal(failures, want) {
		t.Fatalf("redelivered failures: BatchItemFailures %v, want d and e %v", failures, want)
	}
	fleet.CheckChargedBy(t, db, map[string][]string{"ord-a": {"lambda"}, "ord-b": {"lambda"}, "ord-c": {"lambda"}, "ord-f": {"other"}})
	n := out.Counts()
	t.Logf("messages logged %d: processed %d, duplicates %d, in flight %d, failed %d, rejected %d",
		n.Deliveries, n.Processed, n.Duplicates, n.InFlight, n.Failed, n.Rejected)
}

// newTestHandler returns the Lambda handler on db's charges, logging every
// message's outcome to out.
func newTestHandler(t *testing.T, db *pgdeduptest.DB, lockTimeout time.Duration, out *fleet.Log) *lambdaHandler {
	t.Helper()
	log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing", LockTimeout: lockTimeout, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	return &lambdaHandler{keyAttribute: defaultKeyAttribute, charger: &charger{store: store, name: "lambda", log: log}}
}

// loadEvent reads an SQS event as Lambda's runtime does: JSON into
// events.SQSEvent. Its SentTimestamps are moved, keeping their differences,
// so that the last is now: the handler passes them to WithSentAt, and the
// files' own would grow older than the Retention.
func loadEvent(t *testing.T, path string) events.SQSEvent {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var e events.SQSEvent
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	var last int64
	for _, r := range e.Records {
		ms, err := strconv.ParseInt(r.Attributes["SentTimestamp"], 10, 64)
		if err != nil {
			t.Fatalf("%s: SentTimestamp: %v", path, err)
		}
		last = max(last, ms)
	}
	shift := time.Now().UnixMilli() - last
	for _, r := range e.Records {
		ms, _ := strconv.ParseInt(r.Attributes["SentTimestamp"], 10, 64)
		r.Attributes["SentTimestamp"] = strconv.FormatInt(ms+shift, 10)
	}
	return e
}

// The handler passes each message's SentTimestamp to pgdedup.WithSentAt (a
// batch its earliest): a message sent longer ago than the Retention (48 h)
// is refused as too late, not charged, and comes back in BatchItemFailures
// (for the redrive policy), while its batch's others are charged.
func TestLambdaPassesSentTimestamp(t *testing.T) {
	db := fleet.ShopDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := &fleet.Log{}
	h := newTestHandler(t, db, 50*time.Millisecond, out)
	event := loadEvent(t, "testdata/sqs-event.json")
	stale := event.Records[1] // order b; a is sent twice, both in time
	stale.Attributes["SentTimestamp"] = strconv.FormatInt(time.Now().Add(-49*time.Hour).UnixMilli(), 10)
	if failures := invoke(t, ctx, h, event); !slices.Equal(failures, []string{stale.MessageId}) {
		t.Fatalf("BatchItemFailures %v, want the stale message's %s\n%s", failures, stale.MessageId, out.LastLines())
	}
	fleet.CheckChargedBy(t, db, map[string][]string{"ord-a": {"lambda"}})
	if n := out.Counts(); n.Rejected != 1 {
		t.Errorf("rejected %d, want 1 (too late)\n%s", n.Rejected, out.LastLines())
	}
}

// invoke calls the handler with event through JSON, as the runtime does, and
// returns the ItemIdentifiers of its BatchItemFailures.
func invoke(t *testing.T, ctx context.Context, h *lambdaHandler, event events.SQSEvent) []string {
	t.Helper()
	b, err := json.Marshal(event)
	if err != nil {
		t.Fatal(err)
	}
	var in events.SQSEvent
	if err := json.Unmarshal(b, &in); err != nil {
		t.Fatal(err)
	}
	resp, err := h.Handle(ctx, in)
	if err != nil {
		t.Fatalf("Handle returned an error, which retries the whole batch: %v", err)
	}
	var ids []string
	for _, f := range resp.BatchItemFailures {
		ids = append(ids, f.ItemIdentifier)
	}
	return ids
}
