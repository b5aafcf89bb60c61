package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// natsURL returns NATS_URL, or the local server, once it answers with
// JetStream enabled. Without one the test fails in CI (CI set) and skips
// elsewhere.
func natsURL(t *testing.T) string {
	t.Helper()
	u := env("NATS_URL", defaultNATSURL)
	nc, err := nats.Connect(u, nats.Timeout(5*time.Second))
	if err == nil {
		defer nc.Close()
		var js jetstream.JetStream
		if js, err = jetstream.New(nc); err == nil {
			_, err = js.AccountInfo(context.Background())
		}
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("NATS JetStream at %s does not answer (set NATS_URL, or start it: .ci/services.sh start_nats): %v", u, err)
		}
		t.Skipf("no NATS JetStream at %s (set NATS_URL): %v", u, err)
	}
	return u
}

// testStream creates a stream, subject and durable consumer name of the
// test's own, deletes the stream (and so its consumers) when the test ends,
// and returns a JetStream handle on a connection of the test.
type testStream struct {
	js                       jetstream.JetStream
	stream, subject, durable string
}

func newTestStream(t *testing.T, natsURL string, rng *rand.Rand, dupWindow time.Duration) testStream {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	suffix := fmt.Sprintf("%016x", rng.Uint64())
	ts := testStream{js: js, stream: "PGDEDUP_TEST_" + suffix, subject: "pgdedup.test." + suffix, durable: "billing-" + suffix}
	if _, err := ensureStream(context.Background(), js, ts.stream, ts.subject, dupWindow); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := js.DeleteStream(context.Background(), ts.stream); err != nil {
			t.Errorf("delete stream %s: %v", ts.stream, err)
		}
	})
	return ts
}

func countCharged(t *testing.T, db *pgtest.DB) int {
	t.Helper()
	return pgtest.Count(t, db.Pool, "SELECT count(DISTINCT order_id) FROM charges")
}

// countRolledBack is how many charge INSERTs were rolled back: sequence values
// are not given back on rollback, so each leaves a gap in charges.id.
func countRolledBack(t *testing.T, db *pgtest.DB) int {
	t.Helper()
	return pgtest.Count(t, db.Pool, "SELECT coalesce(max(id), 0) - count(*) FROM charges")
}

// checkCharges asserts that charges holds exactly one row per order of want,
// with its customer and amount, and nothing else, and that pgdedup recorded
// one message ID per order.
func checkCharges(t *testing.T, db *pgtest.DB, want map[string]Order) {
	t.Helper()
	ctx := context.Background()
	rows, err := db.Pool.Query(ctx, "SELECT order_id, customer, amount_cents, count(*) OVER (PARTITION BY order_id) FROM charges")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var bad []string
	for rows.Next() {
		var o Order
		var n int
		if err := rows.Scan(&o.OrderID, &o.Customer, &o.AmountCents, &n); err != nil {
			t.Fatal(err)
		}
		switch w, ok := want[o.OrderID]; {
		case !ok:
			bad = append(bad, fmt.Sprintf("charged unknown order %+v", o))
		case n != 1 && !seen[o.OrderID]:
			bad = append(bad, fmt.Sprintf("order %s charged %d times", o.OrderID, n))
		case o != w:
			bad = append(bad, fmt.Sprintf("order %s charged as %+v, published as %+v", o.OrderID, o, w))
		}
		seen[o.OrderID] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id := range want {
		if !seen[id] {
			bad = append(bad, fmt.Sprintf("order %s never charged", id))
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d problems in charges, first ones: %v", len(bad), bad[:min(len(bad), 10)])
	}
	var ids int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM processed_messages WHERE consumer = 'billing'").Scan(&ids); err != nil {
		t.Fatal(err)
	}
	if ids != len(want) {
		t.Errorf("processed_messages holds %d IDs for billing, want one per order: %d", ids, len(want))
	}
}
