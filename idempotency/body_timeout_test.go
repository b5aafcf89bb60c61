package idempotency_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// dribbleSetup serves api through the middleware on a real HTTP server. A
// request with an X-Dribbler header reports on reading the first time its
// body is read (by the middleware, or by the handler without a key).
func dribbleSetup(t *testing.T, cfg idempotency.Config, api *chargeAPI) (b *bundle, addr string, reading chan string) {
	t.Helper()
	db := pgtest.New(t)
	b = setupOn(t, db, db.Pool, cfg, api)
	reading = make(chan string, 16)
	srv := httptest.NewServer(authenticate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name := r.Header.Get("X-Dribbler"); name != "" {
			r.Body = &firstRead{ReadCloser: r.Body, report: func() { reading <- name }}
		}
		b.mw.Wrap(b.api).ServeHTTP(w, r)
	})))
	t.Cleanup(srv.Close)
	return b, srv.Listener.Addr().String(), reading
}

// firstRead calls report on the first Read.
type firstRead struct {
	io.ReadCloser
	once   sync.Once
	report func()
}

func (f *firstRead) Read(p []byte) (int, error) {
	f.once.Do(f.report)
	return f.ReadCloser.Read(p)
}

// dribbler is a client that sends its request's headers and the first byte
// of its body, then the rest only when told.
type dribbler struct {
	conn net.Conn
	rest string
}

// dribble starts a POST of body as bob, with key ("" for none).
func dribble(t *testing.T, addr, name, key, body string) *dribbler {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	head := "POST /charges HTTP/1.1\r\nHost: " + addr + "\r\nAuthorization: Bearer bob-token\r\n" +
		"X-Dribbler: " + name + "\r\nContent-Type: application/json\r\n" +
		fmt.Sprintf("Content-Length: %d\r\n", len(body))
	if key != "" {
		head += "Idempotency-Key: " + key + "\r\n"
	}
	if _, err := conn.Write([]byte(head + "\r\n" + body[:1])); err != nil {
		t.Fatal(err)
	}
	return &dribbler{conn: conn, rest: body[1:]}
}

// finish sends the rest of the body and returns the status answered.
func (d *dribbler) finish(t *testing.T) int {
	t.Helper()
	if _, err := d.conn.Write([]byte(d.rest)); err != nil {
		t.Fatalf("the rest of the body: %v", err)
	}
	return d.status(t)
}

// status reads the answer's status.
func (d *dribbler) status(t *testing.T) int {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(d.conn), nil)
	if err != nil {
		t.Fatalf("the answer: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Two clients that send their bodies a byte at a time, one with a key and one
// without (Optional), do not starve the others: with MaxInFlight 2, while
// both are still sending, another user's keyed requests are answered 201
// (503 when a slow body held a turn on the database, issue 26 §5). The
// dribblers, once they send the rest, are answered too.
func TestSlowBodiesDoNotStarveOthers(t *testing.T) {
	t.Parallel()
	b, addr, reading := dribbleSetup(t, idempotency.Config{
		MaxInFlight: 2, AcquireTimeout: 200 * time.Millisecond, Optional: true,
		RequestBodyTimeout: time.Hour,
	}, nil)

	slow := []*dribbler{
		dribble(t, addr, "keyed", "slow-1", `{"order":"slow-1","amount":1}`),
		dribble(t, addr, "keyless", "", `{"order":"slow-2","amount":2}`),
	}
	<-reading
	<-reading // both bodies are being read
	for i := range 5 {
		if r := post(t, b.url, fmt.Sprint("k", i), order); r.status != 201 {
			t.Fatalf("alice's request %d while two bodies dribble in: %v, want 201", i+1, r)
		}
	}
	for _, d := range slow {
		if got := d.finish(t); got != 201 {
			t.Fatalf("a dribbler, once its body arrived: %d, want 201", got)
		}
	}
	if n := charges(t, b.pool); n != 7 {
		t.Fatalf("%d charges, want 7", n)
	}
}

// A body that stops arriving gets 408 once RequestBodyTimeout has passed,
// and nothing is processed or recorded.
func TestStalledBodyTimesOut(t *testing.T) {
	t.Parallel()
	b, addr, reading := dribbleSetup(t, idempotency.Config{RequestBodyTimeout: 100 * time.Millisecond}, nil)

	d := dribble(t, addr, "stalled", "k", order)
	<-reading
	if got := d.status(t); got != http.StatusRequestTimeout {
		t.Fatalf("a stalled body: %d, want 408", got)
	}
	if c, k, calls := charges(t, b.pool), keys(t, b.pool), b.api.calls.Load(); c != 0 || k != 0 || calls != 0 {
		t.Fatalf("%d charges, %d keys, %d calls after a stalled body, want none", c, k, calls)
	}
}

// RequestBodyTimeout bounds reading the body, not the handler: a handler
// still running after the deadline keeps its request (whose context the
// server would otherwise cancel) and commits.
func TestBodyTimeoutDoesNotCutTheHandler(t *testing.T) {
	t.Parallel()
	const timeout = 50 * time.Millisecond
	api := &chargeAPI{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	b := setup(t, idempotency.Config{RequestBodyTimeout: timeout}, api)
	t.Cleanup(func() { close(api.gate) }) // a failed test leaves no handler waiting

	replies := make(chan reply, 1)
	go func() { r, _ := send(b.url, "k", order); replies <- r }()
	select {
	case <-api.entered:
	case r := <-replies:
		t.Fatalf("answered before the handler ran: %v", r)
	}
	time.Sleep(6 * timeout) // the deadline passes while the handler runs
	api.gate <- struct{}{}
	if r := <-replies; r.status != 201 {
		t.Fatalf("a handler that outlasts RequestBodyTimeout: %v, want 201", r)
	}
	if n := charges(t, b.pool); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}
