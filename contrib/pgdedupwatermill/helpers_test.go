package pgdedupwatermill_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
)

// amqpURL returns AMQP_URL, or the local guest account, once it answers.
// Without a broker the test fails in CI (CI set) and skips elsewhere.
func amqpURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("AMQP_URL")
	if u == "" {
		u = "amqp://guest:guest@127.0.0.1:5672/"
	}
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

// newTopic returns a topic of its own (a durable queue of that name, with
// watermill-amqp's durable-queue config), deleted when the test ends, and a
// function that reports how many messages wait in it.
func newTopic(t *testing.T, url string) (string, func() int) {
	t.Helper()
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	topic := "pgdedupwatermill-test-" + hex.EncodeToString(b)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(topic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := ch.QueueDelete(topic, false, false, false); err != nil {
			t.Errorf("delete queue %s: %v", topic, err)
		}
		_ = conn.Close()
	})
	return topic, func() int {
		q, err := ch.QueueDeclarePassive(topic, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return q.Messages
	}
}

func publish(t *testing.T, url, topic string, msgs []*message.Message) {
	t.Helper()
	pub, err := wamqp.NewPublisher(wamqp.NewDurableQueueConfig(url), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(topic, msgs...); err != nil {
		t.Fatal(err)
	}
}

func subscriber(t testing.TB, url string) message.Subscriber {
	// t is nil in a consumer process.
	sub, err := wamqp.NewSubscriber(wamqp.NewDurableQueueConfig(url), watermill.NopLogger{})
	if err != nil {
		if t == nil {
			panic(err)
		}
		t.Fatal(err)
	}
	return sub
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// proc is a consumer process, the test binary re-executed (see TestMain).
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	n    map[string]int // deliveries by outcome
	tail []string
}

func startConsumer(t *testing.T, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"=1"), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	p := &proc{cmd: cmd, done: make(chan struct{}), n: map[string]int{}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.read(out)
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	return p
}

func (p *proc) read(r io.Reader) {
	s := bufio.NewScanner(r)
	for s.Scan() {
		line := s.Text()
		p.mu.Lock()
		if outcome, ok := strings.CutPrefix(line, "delivery outcome="); ok {
			p.n[outcome]++
		} else if p.tail = append(p.tail, line); len(p.tail) > 10 {
			p.tail = p.tail[1:]
		}
		p.mu.Unlock()
	}
}

// kill sends SIGKILL, so no ack, no rollback and no deferred function runs.
func (p *proc) kill() { _ = p.cmd.Process.Kill(); <-p.done }

// stop asks for a clean exit (the router closes, in-flight handlers finish).
func (p *proc) stop(t *testing.T) {
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		p.kill()
		t.Errorf("consumer did not exit after SIGINT: %s", p.lastLines())
	}
}

func (p *proc) counts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := make(map[string]int, len(p.n))
	for k, v := range p.n {
		m[k] = v
	}
	return m
}

func (p *proc) lastLines() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

func sum(procs []*proc) map[string]int {
	total := map[string]int{}
	for _, p := range procs {
		for k, v := range p.counts() {
			total[k] += v
		}
	}
	return total
}

func orderMessages(n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		id := fmt.Sprintf("order-%04d", i)
		msgs[i] = message.NewMessage(id, []byte(fmt.Sprintf(`{"order_id":%q,"amount_cents":%d}`, id, 100+i)))
		msgs[i].Metadata.Set("order_id", id)
	}
	return msgs
}
