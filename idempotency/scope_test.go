package idempotency_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// Two clients that choose the same key and send the same request each get
// their own answer: the Scope (the verified user) keeps them apart. Only an
// application that opts into GlobalScope shares one namespace.
func TestClientsNeverSeeEachOthersResponses(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil) // Scope: the user authenticate verified

	alice := post(t, b.url, "order-123", order, "Authorization", "Bearer alice-token")
	bob := post(t, b.url, "order-123", order, "Authorization", "Bearer bob-token")
	if alice.status != 201 || bob.status != 201 || alice.replayed() || bob.replayed() || alice.body == bob.body {
		t.Fatalf("alice: %v\nbob: %v", alice, bob)
	}
	for _, c := range []struct {
		token string
		first reply
	}{{"alice-token", alice}, {"bob-token", bob}} {
		if r := post(t, b.url, "order-123", order, "Authorization", "Bearer "+c.token); r.body != c.first.body || !r.replayed() {
			t.Errorf("%s again: %v, want the replay of %v", c.token, r, c.first)
		}
	}
	if charges(t, b.pool) != 2 {
		t.Fatalf("%d charges, want one per client", charges(t, b.pool))
	}

	// Opted in: one namespace, so bob receives alice's answer.
	g := setup(t, idempotency.Config{GlobalScope: true}, nil)
	first := post(t, g.url, "order-123", order, "Authorization", "Bearer alice-token")
	if r := post(t, g.url, "order-123", order, "Authorization", "Bearer bob-token"); r.body != first.body || !r.replayed() {
		t.Fatalf("GlobalScope: bob got %v, want alice's %v", r, first)
	}
}

// A request whose Scope comes back empty (no verified user: authentication
// missing in front of the middleware) is refused, never processed under a
// shared namespace, and the refusal is logged.
func TestEmptyScopeFailsClosed(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	b := setup(t, idempotency.Config{Store: pgdedup.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}}, nil)

	for range 2 {
		if r := post(t, b.url, "k", order, "Authorization", "Bearer forged"); !isProblem(r, 500) || r.replayed() {
			t.Fatalf("unauthenticated: %v", r)
		}
	}
	if b.api.calls.Load() != 0 || keys(t, b.pool) != 0 || charges(t, b.pool) != 0 {
		t.Fatalf("%d calls, %d keys, %d charges; want none", b.api.calls.Load(), keys(t, b.pool), charges(t, b.pool))
	}
	if !strings.Contains(logs.String(), `Config.Scope returned \"\"`) {
		t.Fatalf("the refusal is not logged by its cause:\n%s", logs.String())
	}
}

// A scope of any length or bytes (a bearer token of several KB, invalid
// UTF-8) works: it is hashed before it reaches the table.
func TestLongAndInvalidScope(t *testing.T) {
	t.Parallel()
	scopes := map[string]string{"long": strings.Repeat("t", 4096), "invalid": "caf\xe9\x00\xff"}
	b := setup(t, idempotency.Config{Scope: func(r *http.Request) string { return scopes[r.Header.Get("X-Which")] }}, nil)

	for which := range scopes {
		first := post(t, b.url, "k", order, "X-Which", which)
		again := post(t, b.url, "k", order, "X-Which", which)
		if first.status != 201 || first.replayed() || again.body != first.body || !again.replayed() {
			t.Errorf("%s scope: first %v\nagain %v", which, first, again)
		}
	}
	if charges(t, b.pool) != 2 || keys(t, b.pool) != 2 {
		t.Fatalf("%d charges, %d keys; want 2, 2", charges(t, b.pool), keys(t, b.pool))
	}
}

// The scope (here a secret-looking token) reaches neither the table, nor the
// logs, nor telemetry events: only its keyed hash does.
func TestScopeIsHashedBeforeTableLogsAndEvents(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	var mu sync.Mutex
	var events []pgdedup.Event
	cfg := idempotency.Config{
		Scope: func(r *http.Request) string { return "sk_live_" + userScope(r) },
		Store: pgdedup.Config{
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			OnEvent: func(_ context.Context, e pgdedup.Event) {
				mu.Lock()
				events = append(events, e)
				mu.Unlock()
			},
		},
	}
	api := &chargeAPI{}
	api.failNext.Store(1)
	b := setup(t, cfg, api)
	post(t, b.url, "k2", order) // 502: rolled back
	post(t, b.url, "k2", order) // processed
	post(t, b.url, "k2", order) // duplicate, replayed

	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE message_id LIKE '%sk_live%' OR message_id LIKE '%alice%'
OR encode(result, 'escape') LIKE '%sk_live%' OR encode(result, 'escape') LIKE '%alice%'`); n != 0 {
		t.Fatalf("%d rows hold the scope", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) == 0 {
		t.Fatal("no events")
	}
	for _, e := range events {
		if strings.Contains(e.MessageID, "sk_live") || !strings.HasSuffix(e.MessageID, " k2") {
			t.Errorf("event %v: message ID %q", e.Kind, e.MessageID)
		}
	}
	if strings.Contains(logs.String(), "sk_live") || !strings.Contains(logs.String(), " k2") {
		t.Fatalf("logs:\n%s", logs.String())
	}
}

// The stored fingerprint is an HMAC keyed by Config.Secret, not a plain hash
// of the request that a guess (a card number's missing digits) can be checked
// against.
func TestFingerprintIsKeyedBySecret(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	other := setupOn(t, b.db, b.pool, idempotency.Config{Secret: []byte(strings.Repeat("another secret ", 3)), Store: pgdedup.Config{Consumer: "http2"}}, nil)
	post(t, b.url, "k", order)
	post(t, other.url, "k", order)

	var fps [][]byte
	rows, err := b.pool.Query(context.Background(), `SELECT fingerprint FROM processed_messages ORDER BY consumer`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var fp []byte
		if err := rows.Scan(&fp); err != nil {
			t.Fatal(err)
		}
		fps = append(fps, fp)
	}
	if len(fps) != 2 || bytes.Equal(fps[0], fps[1]) {
		t.Fatalf("fingerprints of one request under two secrets: %x", fps)
	}
	for _, plain := range []string{"POST /charges\n" + order, "POST /charges " + order, order} {
		sum := sha256.Sum256([]byte(plain))
		if bytes.Equal(fps[0], sum[:]) || bytes.Equal(fps[1], sum[:]) {
			t.Fatalf("a fingerprint is the plain SHA-256 of %q", plain)
		}
	}
}

// A custom Fingerprint that looks at the body alone still cannot replay one
// endpoint's answer on another: the method and the path are always mixed in.
func TestCustomFingerprintMixesMethodAndRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	mw, err := idempotency.New(b.pool, withDefaults(idempotency.Config{
		Fingerprint: func(_ *http.Request, body []byte) string { return string(body) },
	}))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/charges", mw.Wrap(b.api))
	mux.Handle("/refunds", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"refund":true}`))
	})))
	srv := httptest.NewServer(authenticate(mux))
	t.Cleanup(srv.Close)

	charge := post(t, srv.URL+"/charges", "k", order)
	if charge.status != 201 {
		t.Fatal(charge)
	}
	if r := post(t, srv.URL+"/refunds", "k", order); !isProblem(r, 422) || r.replayed() {
		t.Fatalf("same key and body on another endpoint: %v", r)
	}
	if r := post(t, srv.URL+"/charges?ignored=by-the-fingerprint", "k", order); r.body != charge.body || !r.replayed() {
		t.Fatalf("the custom fingerprint ignores the query: %v", r)
	}
}

// syncBuffer is a bytes.Buffer for a logger written from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
