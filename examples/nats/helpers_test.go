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

	"github.com/pgdedup/pgdedup/examples/internal/cli"
)

// natsURL returns NATS_URL, or the local server, once it answers with
// JetStream enabled. Without one the test fails in CI (CI set) and skips
// elsewhere.
func natsURL(t *testing.T) string {
	t.Helper()
	u := cli.Env("NATS_URL", defaultNATSURL)
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
