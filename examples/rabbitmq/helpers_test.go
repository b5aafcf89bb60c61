package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgdedup/pgdedup/examples/internal/cli"
)

// rabbitURL returns AMQP_URL, or the local guest account, once it answers.
// Without a broker the test fails in CI (CI set) and skips elsewhere.
func rabbitURL(t *testing.T) string {
	t.Helper()
	u := cli.Env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
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
