package idempotency_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

func TestOptionalKeyStillRunsInATransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{Optional: true}, nil)

	if r := post(t, b.url, "", order); r.status != 201 {
		t.Fatalf("no key: %v", r)
	}
	b.api.failNext.Store(1)
	if r := post(t, b.url, "", order); r.status != 502 {
		t.Fatalf("no key, failing handler: %v", r)
	}
	if r := post(t, b.url, "", order); r.status != 201 || r.replayed() {
		t.Fatalf("no key again: %v", r)
	}
	// Without a key nothing is deduplicated or recorded; the 5xx rolled back.
	if charges(t, b.pool) != 2 || keys(t, b.pool) != 0 {
		t.Fatalf("%d charges, %d keys; want 2, 0", charges(t, b.pool), keys(t, b.pool))
	}
}

func TestLargeResponseIsSentButOnlyStatusAndHeadersReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{MaxStoredBody: 100}, newAPI(101))

	first := post(t, b.url, "big", order)
	if first.status != 201 || len(first.body) != 101 {
		t.Fatalf("first: %v", first)
	}
	again := post(t, b.url, "big", order)
	if again.status != 201 || again.body != "" || !again.replayed() ||
		again.header.Get(idempotency.BodyOmittedHeader) != "true" ||
		again.header.Get("Location") != first.header.Get("Location") {
		t.Fatalf("retry: %v", again)
	}
	if b.api.calls.Load() != 1 || charges(t, b.pool) != 1 {
		t.Fatalf("%d handler calls, %d charges; want 1, 1", b.api.calls.Load(), charges(t, b.pool))
	}
	// At the limit, the body is kept.
	b.api.bodySize.Store(100)
	post(t, b.url, "at-limit", order)
	if r := post(t, b.url, "at-limit", order); len(r.body) != 100 || !r.replayed() {
		t.Fatalf("response of exactly MaxStoredBody, replayed: %v", r)
	}
}

func TestRequestBodyLimitAndClientErrorsStored(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{MaxRequestBody: 64}, nil)

	if r := post(t, b.url, "k", `{"order":"`+strings.Repeat("x", 60)+`"}`); !isProblem(r, 413) {
		t.Fatalf("body over MaxRequestBody: %v", r)
	}
	// A 4xx from the handler is the request's answer: stored and replayed.
	bad := post(t, b.url, "k", `not json`)
	if bad.status != 400 || bad.replayed() {
		t.Fatalf("bad JSON: %v", bad)
	}
	if r := post(t, b.url, "k", `not json`); r.status != 400 || r.body != bad.body || !r.replayed() {
		t.Fatalf("bad JSON again: %v", r)
	}
	if b.api.calls.Load() != 1 || keys(t, b.pool) != 1 {
		t.Fatalf("%d handler calls, %d keys; want 1, 1", b.api.calls.Load(), keys(t, b.pool))
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	db := setup(t, idempotency.Config{}, nil).pool
	scope := func(*http.Request) string { return "x" }
	for name, cfg := range map[string]idempotency.Config{
		"no scope":               {Secret: testSecret},
		"scope and global":       {Scope: scope, GlobalScope: true, Secret: testSecret},
		"no secret":              {Scope: scope},
		"short secret":           {Scope: scope, Secret: testSecret[:idempotency.MinSecretLen-1]},
		"negative wait":          {InFlightWait: -1},
		"key too long":           {MaxKeyLen: 2000},
		"negative body":          {MaxStoredBody: -1},
		"bad table":              {Store: pgdedup.Config{Table: "x.y.z"}},
		"negative request":       {MaxRequestBody: -1},
		"negative in flight":     {MaxInFlight: -1},
		"negative acquire":       {AcquireTimeout: -1},
		"negative waiters":       {MaxWaitersPerKey: -1},
		"unknown policy":         {ClientErrors: 7},
		"header with a space":    {Header: "Idempotency Key"},
		"replay Set-Cookie":      {ReplayHeaders: []string{"Content-Type", "set-cookie"}},
		"replay a bad name":      {ReplayHeaders: []string{"X Y"}},
		"not kept 500":           {NotKept: []int{500}},
		"not kept 200":           {NotKept: []int{200}},
		"safe method with space": {SafeMethods: []string{"GET "}},
	} {
		if name != "no scope" && name != "scope and global" && name != "no secret" && name != "short secret" {
			cfg = withDefaults(cfg)
		}
		if _, err := idempotency.New(db, cfg); err == nil {
			t.Errorf("%s: no error", name)
		} else if !strings.HasPrefix(err.Error(), "idempotency: Config.") && !strings.HasPrefix(err.Error(), "pgdedup: Config.") {
			t.Errorf("%s: %v does not name the field", name, err)
		}
	}
	if _, err := idempotency.New(db, idempotency.Config{GlobalScope: true, Secret: testSecret[:idempotency.MinSecretLen]}); err != nil {
		t.Errorf("GlobalScope and a secret of MinSecretLen: %v", err)
	}
}

func TestCustomHeaderName(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{Header: "x-request-key"}, nil)

	if r := post(t, b.url, "k", order); !isProblem(r, 400) || !strings.Contains(r.body, "X-Request-Key") {
		t.Fatalf("only Idempotency-Key sent: %v", r)
	}
	first := post(t, b.url, "", order, "X-Request-Key", "k")
	again := post(t, b.url, "", order, "X-Request-Key", "k")
	if first.status != 201 || again.body != first.body || !again.replayed() || b.api.calls.Load() != 1 {
		t.Fatalf("first: %v\nagain: %v\ncalls %d", first, again, b.api.calls.Load())
	}
}

func TestKeyValidationAndMissingKey(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{MaxKeyLen: 16}, nil)

	for name, r := range map[string]reply{
		"missing":   post(t, b.url, "", order),
		"too long":  post(t, b.url, strings.Repeat("k", 17), order),
		"space":     post(t, b.url, "a b", order),
		"non-ASCII": post(t, b.url, "clé", order),
		"two keys":  post(t, b.url, "a", order, "Idempotency-Key", "b"),
	} {
		if !isProblem(r, 400) {
			t.Errorf("%s: %v", name, r)
		}
	}
	if r := post(t, b.url, strings.Repeat("k", 16), order); r.status != 201 {
		t.Fatalf("key of MaxKeyLen: %v", r)
	}
	if b.api.calls.Load() != 1 || keys(t, b.pool) != 1 {
		t.Fatalf("%d handler calls, %d keys; want 1, 1", b.api.calls.Load(), keys(t, b.pool))
	}
}

func TestWaiterRunsHandlerWhenTheFirstFails(t *testing.T) {
	t.Parallel()
	api := &chargeAPI{gate: make(chan struct{}), entered: make(chan struct{}, 2)}
	api.failNext.Store(1)
	b := setup(t, idempotency.Config{InFlightWait: time.Minute}, api)

	replies := make(chan reply, 2)
	go func() { r, _ := send(b.url, "k", order); replies <- r }()
	<-api.entered // the first holds the key
	go func() { r, _ := send(b.url, "k", order); replies <- r }()
	time.Sleep(100 * time.Millisecond) // let the second start waiting
	api.gate <- struct{}{}             // the first answers 502 and rolls back
	first := <-replies
	<-api.entered // the waiter claimed the key and runs the handler
	api.gate <- struct{}{}
	second := <-replies
	if first.status != 502 || second.status != 201 || second.replayed() {
		t.Fatalf("first: %v\nsecond: %v", first, second)
	}
	if api.calls.Load() != 2 || charges(t, b.pool) != 1 {
		t.Fatalf("%d calls, %d charges; want 2, 1", api.calls.Load(), charges(t, b.pool))
	}
}

// The middleware stores bodies up to its own MaxStoredBody, beyond the
// Store's MaxResultBytes; a larger body leaves only the status and headers
// in the table. A response whose kept headers exceed what a stored response
// may hold besides its body fails with 500, its writes rolled back, and the
// log names pgdedup.ErrResultTooLarge.
func TestStoredBodyLimitIsTheMiddlewares(t *testing.T) {
	t.Parallel()
	const limit = 3 * pgdedup.DefaultMaxResultBytes
	var logs syncBuffer
	b := setup(t, idempotency.Config{MaxStoredBody: limit, ReplayHeaders: []string{"Location", "X-Big"},
		Store: pgdedup.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}}, newAPI(limit))
	first := post(t, b.url, "at-limit", order)
	if r := post(t, b.url, "at-limit", order); len(r.body) != limit || r.body != first.body || !r.replayed() {
		t.Fatalf("a body of MaxStoredBody (%d bytes), replayed: %d bytes, %v", limit, len(r.body), r.status)
	}
	b.api.bodySize.Store(limit + 1)
	post(t, b.url, "over", order)
	if r := post(t, b.url, "over", order); r.body != "" || r.header.Get(idempotency.BodyOmittedHeader) != "true" {
		t.Fatalf("a body over MaxStoredBody, replayed: %v", r)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE octet_length(result) < 1000`); n != 1 {
		t.Fatalf("%d stored responses without a body, want 1", n)
	}

	big := setupOn(t, b.db, b.pool, idempotency.Config{MaxStoredBody: 100, ReplayHeaders: []string{"X-Big"}, Store: pgdedup.Config{Consumer: "big",
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}}, nil)
	mux := http.NewServeMux()
	mux.Handle("POST /charges", big.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		big.api.ServeHTTP(&bigHeader{w}, r)
	})))
	srv := httptest.NewServer(authenticate(mux))
	t.Cleanup(srv.Close)
	before := charges(t, b.pool)
	if r := post(t, srv.URL+"/charges", "k", order); !isProblem(r, 500) || !strings.Contains(logs.String(), pgdedup.ErrResultTooLarge.Error()) || !strings.Contains(logs.String(), "besides MaxStoredBody") {
		t.Fatalf("headers over the allowance: %d\nlogs: %.2000s", r.status, logs.String())
	}
	if charges(t, b.pool) != before || pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'big'`) != 0 {
		t.Fatal("a response too large to store left its writes or its key")
	}
}

// bigHeader adds a header larger than a stored response's allowance.
type bigHeader struct{ http.ResponseWriter }

func (w *bigHeader) WriteHeader(status int) {
	w.Header().Set("X-Big", strings.Repeat("h", idempotency.StoredOverhead+100))
	w.ResponseWriter.WriteHeader(status)
}
