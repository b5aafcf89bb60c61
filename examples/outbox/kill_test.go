package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	mrand "math/rand/v2"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgdedup/pgdedup/internal/pgtest"
)

const childEnv = "OUTBOX_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		if err := run([]string{"run"}); err != nil {
			fmt.Fprintln(os.Stderr, "outbox:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// receiver is the confirmation service: it confirms each order once, keyed by
// the request's Idempotency-Key, and fails on purpose: some requests get 503
// before anything happens, some after the order was confirmed (the answer
// lost), so River retries both.
type receiver struct {
	mu                        sync.Mutex
	confirmed                 map[string]int64 // order ID -> amount
	requests, repeats, failed int
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var args ConfirmArgs
	if err := json.NewDecoder(r.Body).Decode(&args); err != nil || r.Header.Get("Idempotency-Key") != "confirm-"+args.OrderID {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.requests++
	roll := mrand.IntN(100)
	if roll < 15 {
		rc.failed++
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return
	}
	if _, ok := rc.confirmed[args.OrderID]; ok {
		rc.repeats++ // a retry of a confirmation that happened: answer as before
	} else {
		rc.confirmed[args.OrderID] = args.AmountCents
	}
	if roll < 25 {
		rc.failed++
		http.Error(w, "timeout after confirming", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (rc *receiver) counts() (confirmed, requests, repeats, failed int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.confirmed), rc.requests, rc.repeats, rc.failed
}

// child is a process running `outbox run`: the test binary re-executed.
type child struct {
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	n    map[string]int
	tail []string
}

func startChild(t *testing.T, env []string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"=1"), env...)
	out, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, done: make(chan struct{}), n: map[string]int{}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		c.read(out)
		_ = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(c.kill)
	return c
}

func (c *child) read(r io.Reader) {
	s := bufio.NewScanner(r)
	for s.Scan() {
		line := s.Text()
		c.mu.Lock()
		if strings.Contains(line, " delivery outcome=") { // slog's default: "... INFO delivery outcome=processed"
			_, outcome, _ := strings.Cut(line, " outcome=")
			outcome, _, _ = strings.Cut(outcome, " ")
			c.n[outcome]++
		} else if c.tail = append(c.tail, line); len(c.tail) > 10 {
			c.tail = c.tail[1:]
		}
		c.mu.Unlock()
	}
}

// kill sends SIGKILL: the consumer's open transaction and the worker's
// running job are abandoned as they are.
func (c *child) kill() { _ = c.cmd.Process.Kill(); <-c.done }

func (c *child) stop(t *testing.T) {
	_ = c.cmd.Process.Signal(os.Interrupt)
	select {
	case <-c.done:
	case <-time.After(time.Minute):
		c.kill()
		t.Errorf("child did not exit after SIGINT: %s", strings.Join(c.tail, "\n"))
	}
}

// TestKilledConsumersAndWorkersConfirmEachOrderOnce publishes orders to
// RabbitMQ, a tenth of them twice, and runs three processes that each consume
// (pgdedup, InsertTx of the confirmation job) and work (River, POST to the
// receiver, which fails a quarter of the requests). It SIGKILLs processes
// mid-run, consumers and River workers alike, and starts replacements. In the
// end: every order written once, exactly one job per order, every job
// completed, and the receiver, keyed by order, confirmed every order once
// although some were sent more than once.
func TestKilledConsumersAndWorkersConfirmEachOrderOnce(t *testing.T) {
	const (
		orders = 300
		procs  = 3
		kills  = 4
	)
	amqpURL := rabbitURL(t)
	db := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rc := &receiver{confirmed: map[string]int64{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	queue := testQueue(t, amqpURL)

	var bodies [][]byte
	for i := range orders {
		b, _ := json.Marshal(Order{OrderID: fmt.Sprintf("order-%04d", i), AmountCents: int64(100 + i)})
		bodies = append(bodies, b)
		if i%10 == 0 {
			bodies = append(bodies, b)
		}
	}
	mrand.Shuffle(len(bodies), func(i, j int) { bodies[i], bodies[j] = bodies[j], bodies[i] })
	publish(t, amqpURL, queue.name, bodies)

	env := []string{"DATABASE_URL=" + db.URL, "AMQP_URL=" + amqpURL, "QUEUE=" + queue.name, "CONFIRM_URL=" + srv.URL}
	var all, running []*child
	for range procs {
		c := startChild(t, env)
		all, running = append(all, c), append(running, c)
	}
	count := func(sql string) int { return pgtest.Count(t, db.Pool, sql) }
	for k := range kills {
		// Alternate: kill at points of the consumers' progress, then of the
		// workers' (jobs completed), so kills land in both.
		what := `SELECT count(*) FROM orders`
		if k%2 == 1 {
			what = `SELECT count(*) FROM river_job WHERE state = 'completed'`
		}
		waitUntil(t, ctx, "progress", func() bool { return count(what) >= orders*(k+1)/(kills+2) })
		i := mrand.IntN(len(running))
		running[i].kill()
		c := startChild(t, env)
		all, running[i] = append(all, c), c
	}
	waitUntil(t, ctx, "every order written, every job completed and the queue drained", func() bool {
		return count(`SELECT count(*) FROM orders`) == orders &&
			count(`SELECT count(*) FROM river_job WHERE state = 'completed'`) == orders && queue.waiting(t) == 0
	})
	for _, c := range running {
		c.stop(t)
	}

	deliveries := map[string]int{}
	for _, c := range all {
		c.mu.Lock()
		for k, v := range c.n {
			deliveries[k] += v
		}
		c.mu.Unlock()
	}
	confirmed, requests, repeats, failed := rc.counts()
	t.Logf("%d orders + %d duplicates published; %d processes, %d SIGKILLed; deliveries: %d processed, %d duplicate, %d failed; "+
		"jobs run more than once: %d, of which rescued after a killed worker: %d; receiver: %d requests, %d answered 503, %d repeats of a confirmed order, %d orders confirmed",
		orders, len(bodies)-orders, len(all), kills, deliveries["processed"], deliveries["duplicate"], deliveries["failed"],
		count(`SELECT count(*) FROM river_job WHERE attempt > 1`),
		count(`SELECT count(*) FROM river_job WHERE errors::text LIKE '%Stuck job rescued%'`), requests, failed, repeats, confirmed)
	if n := count(`SELECT count(*) FROM river_job`); n != orders {
		t.Errorf("%d jobs for %d orders", n, orders)
	}
	if n := count(`SELECT count(*) FROM (SELECT args->>'order_id' FROM river_job GROUP BY 1 HAVING count(*) = 1) j`); n != orders {
		t.Errorf("%d orders have exactly one job, want %d", n, orders)
	}
	if confirmed != orders {
		t.Errorf("the receiver confirmed %d orders, want %d", confirmed, orders)
	}
	rc.mu.Lock()
	for i := range orders {
		id := fmt.Sprintf("order-%04d", i)
		if rc.confirmed[id] != int64(100+i) {
			t.Errorf("%s confirmed with %d", id, rc.confirmed[id])
		}
	}
	rc.mu.Unlock()
	if failed == 0 || requests <= orders {
		t.Errorf("no retry exercised: %d requests, %d failed", requests, failed)
	}
}

func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// rabbitURL returns AMQP_URL, or the local guest account, once it answers.
// Without a broker the test fails in CI (CI set) and skips elsewhere.
func rabbitURL(t *testing.T) string {
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

type testQ struct {
	name string
	ch   *amqp.Channel
}

// testQueue declares a durable queue of its own, deleted when the test ends.
func testQueue(t *testing.T, url string) *testQ {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	q := &testQ{name: "pgdedup-outbox-test-" + hex.EncodeToString(b)}
	if q.ch, err = conn.Channel(); err != nil {
		t.Fatal(err)
	}
	if _, err := q.ch.QueueDeclare(q.name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := q.ch.QueueDelete(q.name, false, false, false); err != nil {
			t.Errorf("delete queue %s: %v", q.name, err)
		}
		_ = conn.Close()
	})
	return q
}

func (q *testQ) waiting(t *testing.T) int {
	st, err := q.ch.QueueDeclarePassive(q.name, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st.Messages
}

func publish(t *testing.T, url, queue string, bodies [][]byte) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, b := range bodies {
		c, err := ch.PublishWithDeferredConfirm("", queue, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: b})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := c.WaitContext(context.Background()); !ok || err != nil {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}
}
