package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// rabbitURL returns AMQP_URL, or the local guest account, once it answers.
// Without a broker the test fails in CI (CI set) and skips elsewhere.
func rabbitURL(t *testing.T) string {
	t.Helper()
	u := env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("RabbitMQ at %s does not answer (set AMQP_URL, or start it: .ci/services.sh start_rabbitmq): %v", u, err)
		}
		t.Skipf("no RabbitMQ at %s (set AMQP_URL): %v", u, err)
	}
	_ = conn.Close()
	return u
}

// testQueue declares a durable queue with a name of its own, deleted when the
// test ends, and returns a channel on it.
func testQueue(t *testing.T, amqpURL string, rng *rand.Rand) (*amqp.Channel, string) {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	queue := fmt.Sprintf("pgdedup-test-%016x", rng.Uint64())
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := declareQueue(ch, queue); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // on a channel of its own: a failed call closes the test's
		ch, err := conn.Channel()
		if err == nil {
			_, err = ch.QueueDelete(queue, false, false, false)
		}
		if err != nil {
			t.Errorf("delete queue %s: %v", queue, err)
		}
	})
	return ch, queue
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
