// Package apitest checks, through a web framework's router, the orders API
// that examples/chi, examples/echo and examples/gin serve: writes made
// idempotent by pgdedup's idempotency middleware.
//
// The API: POST /orders with "Authorization: Bearer alice-token" (or
// bob-token) and {"item": "..."} inserts a row into orders (owner, item) in
// the middleware's transaction and answers 201.
package apitest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// Reply is one HTTP answer.
type Reply struct {
	Status int
	Header http.Header
	Body   string
}

// Replayed reports whether the middleware answered from the stored response.
func (r Reply) Replayed() bool { return r.Header.Get(idempotency.ReplayedHeader) == "true" }

// Problem returns the problem type of one of the middleware's own answers
// (application/problem+json), or "".
func (r Reply) Problem() string {
	var p struct{ Type string }
	if r.Header.Get("Content-Type") != idempotency.ProblemContentType || json.Unmarshal([]byte(r.Body), &p) != nil {
		return ""
	}
	return p.Type
}

// Post sends POST url+path as alice (or as the user of token) with key as its
// Idempotency-Key (none if "").
func Post(t testing.TB, url, path, token, key, body string) Reply {
	t.Helper()
	return Do(t, http.MethodPost, url, path, token, key, body)
}

// Do sends method url+path as the user of token with key as its
// Idempotency-Key (none if "").
func Do(t testing.TB, method, url, path, token, key, body string) Reply {
	t.Helper()
	r, err := send(method, url+path, token, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func send(method, url, token, key, body string) (Reply, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return Reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return Reply{resp.StatusCode, resp.Header, string(b)}, err
}

// ReplayAndConflict proves, through the router serving url, what the
// middleware promises for POST /orders:
//
//   - a retry with the same key gets the first response replayed, and no
//     second order;
//   - the same key with another body gets 422 (#key-reused);
//   - a request whose key is held by one still running gets 409
//     (#key-in-flight) with Retry-After, at once;
//   - the first one then commits, and its retry is a replay.
//
// The request "still running" is real: the test locks the orders table, so
// the first request waits inside its handler, at its INSERT, holding its key.
func ReplayAndConflict(t *testing.T, pool *pgxpool.Pool, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	before := pgdeduptest.Count(t, pool, `SELECT count(*) FROM orders`)

	first := Post(t, url, "/orders", "alice-token", "k-replay", `{"item":"book"}`)
	if first.Status != http.StatusCreated || first.Replayed() {
		t.Fatalf("first POST: %d %s", first.Status, first.Body)
	}
	again := Post(t, url, "/orders", "alice-token", "k-replay", `{"item":"book"}`)
	if again.Status != first.Status || again.Body != first.Body || !again.Replayed() {
		t.Fatalf("retry: %d %v %s, want the first answer replayed", again.Status, again.Header, again.Body)
	}
	if r := Post(t, url, "/orders", "alice-token", "k-replay", `{"item":"pen"}`); r.Status != http.StatusUnprocessableEntity ||
		!strings.HasSuffix(r.Problem(), "#key-reused") {
		t.Fatalf("same key, other body: %d %s", r.Status, r.Body)
	}

	// Hold the first request of k-busy inside its handler.
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	var lockPID int
	if err := lock.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&lockPID); err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, `LOCK TABLE orders IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		r   Reply
		err error
	}
	busy := make(chan result, 1)
	go func() {
		r, err := send(http.MethodPost, url+"/orders", "alice-token", "k-busy", `{"item":"lamp"}`)
		busy <- result{r, err}
	}()
	for { // until its INSERT waits for the lock: its key is claimed by then
		n := pgdeduptest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, lockPID)
		if n > 0 {
			break
		}
		select {
		case r := <-busy:
			t.Fatalf("the first k-busy request ended while orders was locked: %v %d %s", r.err, r.r.Status, r.r.Body)
		case <-ctx.Done():
			t.Fatal("the first k-busy request never reached its INSERT")
		case <-time.After(10 * time.Millisecond):
		}
	}
	dup := Post(t, url, "/orders", "alice-token", "k-busy", `{"item":"lamp"}`)
	if dup.Status != http.StatusConflict || !strings.HasSuffix(dup.Problem(), "#key-in-flight") || dup.Header.Get("Retry-After") == "" {
		t.Fatalf("same key while the first runs: %d %v %s, want 409 #key-in-flight", dup.Status, dup.Header, dup.Body)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-busy
	if res.err != nil || res.r.Status != http.StatusCreated {
		t.Fatalf("first k-busy request: %v %d %s", res.err, res.r.Status, res.r.Body)
	}
	if r := Post(t, url, "/orders", "alice-token", "k-busy", `{"item":"lamp"}`); !r.Replayed() || r.Body != res.r.Body {
		t.Fatalf("retry after the first committed: %d %s", r.Status, r.Body)
	}
	if n := pgdeduptest.Count(t, pool, `SELECT count(*) FROM orders`) - before; n != 2 {
		t.Fatalf("%d new orders, want 2 (k-replay's and k-busy's)", n)
	}
}
