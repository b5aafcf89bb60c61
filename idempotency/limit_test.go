package idempotency_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// eventually polls cond until it holds; it fails t after a minute. It waits
// for requests to reach a state, and asserts nothing about time.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still not: %s", what)
		}
	}
}

// slowSetup is setup on a pool of 4 connections, with a handler that holds
// each request until released.
func slowSetup(t *testing.T, cfg idempotency.Config) (*bundle, *pgxpool.Pool) {
	t.Helper()
	db := pgtest.New(t)
	pool := pgtest.Pool(t, db.URL, 4)
	api := &chargeAPI{gate: make(chan struct{}), entered: make(chan struct{}, 64)}
	b := setupOn(t, db, pool, cfg, api)
	// A test that fails with handlers held releases them, so that the
	// server can close and no transaction is left open (one left idle in
	// transaction holds up CREATE INDEX CONCURRENTLY in every test's schema).
	t.Cleanup(func() { close(api.gate) })
	return b, pool
}

// With a pool of 4, keyed requests hold at most MaxInFlight (by default half
// the pool) connections however many arrive: the rest of the service keeps
// connections, and the requests beyond the cap get 503 with Retry-After once
// AcquireTimeout has passed, without being processed.
func TestMaxInFlightLeavesConnectionsToOthers(t *testing.T) {
	t.Parallel()
	b, pool := slowSetup(t, idempotency.Config{AcquireTimeout: 100 * time.Millisecond})

	const n = 6
	replies := make(chan reply, n)
	for i := range n {
		go func() { r, _ := send(b.url, fmt.Sprint("k", i), order); replies <- r }()
	}
	busy := 0
	for held := 0; held < 2; { // until two handlers hold connections
		select {
		case <-b.api.entered:
			held++
		case r := <-replies:
			if !isProblem(r, 503) || r.header.Get("Retry-After") == "" {
				t.Fatalf("a request answered before two handlers held connections: %v", r)
			}
			busy++
		}
	}
	for busy < n-2 {
		r := <-replies
		if !isProblem(r, 503) || r.header.Get("Retry-After") == "" {
			t.Fatalf("request beyond the cap: %v", r)
		}
		busy++
	}
	if got := pool.Stat().AcquiredConns(); got > 2 {
		t.Fatalf("%d connections held by the middleware, want at most 2 of 4", got)
	}
	var one int // the rest of the service still gets a connection
	if err := pool.QueryRow(t.Context(), `SELECT 1`).Scan(&one); err != nil {
		t.Fatal(err)
	}
	b.api.gate <- struct{}{}
	b.api.gate <- struct{}{}
	for range 2 {
		if r := <-replies; r.status != 201 {
			t.Fatal(r)
		}
	}
	if busy != n-2 || b.api.calls.Load() != 2 || charges(t, b.pool) != 2 {
		t.Fatalf("%d busy, %d calls, %d charges", busy, b.api.calls.Load(), charges(t, b.pool))
	}
}

// One slow request and 11 duplicates of its key hold one connection: the
// duplicates wait in memory, then replay the first answer without a round
// trip each, as a lookup would (bodies through StoredBody). More than
// MaxWaitersPerKey get 409 at once.
func TestSameKeyWaitersHoldNoConnection(t *testing.T) {
	t.Parallel()
	b, pool := slowSetup(t, idempotency.Config{InFlightWait: time.Minute, MaxWaitersPerKey: 11, StoredBody: newSealed(t)})

	replies := make(chan reply, 13)
	go func() { r, _ := send(b.url, "same", order); replies <- r }()
	<-b.api.entered
	for range 11 {
		go func() { r, _ := send(b.url, "same", order); replies <- r }()
	}
	eventually(t, "11 requests waiting for the key", func() bool { _, n := b.mw.Waiting(); return n == 11 })
	if got := pool.Stat().AcquiredConns(); got != 1 {
		t.Fatalf("%d connections held by 1 request and 11 duplicates, want 1", got)
	}
	if r := post(t, b.url, "same", order); !isProblem(r, 409) {
		t.Fatalf("the 12th duplicate, over MaxWaitersPerKey: %v", r)
	}
	b.api.gate <- struct{}{}
	first, fresh := reply{}, 0
	for range 12 {
		r := <-replies
		if r.status != 201 {
			t.Fatal(r)
		}
		if first.body == "" {
			first = r
		}
		if r.body != first.body {
			t.Fatalf("different answers: %v and %v", r, first)
		}
		if !r.replayed() {
			fresh++
		}
	}
	if fresh != 1 || b.api.calls.Load() != 1 || charges(t, b.pool) != 1 {
		t.Fatalf("%d fresh, %d calls, %d charges; want 1 each", fresh, b.api.calls.Load(), charges(t, b.pool))
	}
	// A waiter with another body gets 422 from the kept answer.
	if r := post(t, b.url, "same", `{"order":"o-2","amount":1}`); !isProblem(r, 422) {
		t.Fatal(r)
	}
}

// A client that reads its answer and sends the same key again at once finds
// the key's flight ended, and gets the stored answer, not 409 (InFlightWait
// is 0). The server here is slow to return once it has written an answer, as
// a loaded machine's can be, while the answer is already with the client.
func TestSendingAgainAfterTheAnswerFindsTheFlightEnded(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, newAPI(64<<10))
	mux := http.NewServeMux()
	mux.Handle("POST /charges", b.mw.Wrap(b.api))
	srv := httptest.NewServer(authenticate(slowAfterWrite(mux)))
	t.Cleanup(srv.Close)
	first := post(t, srv.URL+"/charges", "k", order)
	if first.status != http.StatusCreated || first.replayed() {
		t.Fatalf("first: %v", first.status)
	}
	for i := range 2 {
		if r := post(t, srv.URL+"/charges", "k", order); !r.replayed() || r.body != first.body {
			t.Fatalf("sent again (%d): %d, replayed %v", i+1, r.status, r.replayed())
		}
	}
	if b.api.calls.Load() != 1 || charges(t, b.pool) != 1 {
		t.Fatalf("%d handler calls, %d charges; want 1, 1", b.api.calls.Load(), charges(t, b.pool))
	}
}

// slowAfterWrite flushes each write to the client at once, then holds the
// handler for 300 ms before it may go on.
func slowAfterWrite(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&flushThenWait{w}, r)
	})
}

type flushThenWait struct{ http.ResponseWriter }

func (w *flushThenWait) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	_ = http.NewResponseController(w.ResponseWriter).Flush()
	time.Sleep(300 * time.Millisecond)
	return n, err
}
