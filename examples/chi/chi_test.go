package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pgdedup/pgdedup/examples/internal/apitest"
	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// serve starts the API on a database of the test's own and returns the
// database and the server's URL.
func serve(t *testing.T) (*pgdeduptest.DB, string) {
	t.Helper()
	db := pgdeduptest.New(t)
	router, err := newRouter(context.Background(), db.Pool, []byte("chi example test secret of 32+ bytes"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(router)
	t.Cleanup(srv.Close)
	return db, srv.URL
}

// Through chi's r.Use(mw.Wrap): reads and the docs page pass through without a
// key, writes need one and are made idempotent per user.
func TestChiRouterUse(t *testing.T) {
	t.Parallel()
	db, url := serve(t)
	do := func(method, path, key, token, body string) (int, http.Header, string) {
		t.Helper()
		r := apitest.Do(t, method, url, path, token, key, body)
		return r.Status, r.Header, r.Body
	}

	if code, h, body := do("GET", idempotency.DefaultDocsURL, "", "", ""); code != 200 || !strings.Contains(body, "Idempotency-Key") || h.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("docs page through r.Use(mw.Wrap): %d %s", code, body)
	}
	if code, _, body := do("POST", "/orders", "", "alice-token", `{"item":"book"}`); code != 400 || !strings.Contains(body, "#missing-key") {
		t.Fatalf("POST without a key: %d %s", code, body)
	}
	code, h, first := do("POST", "/orders", "k1", "alice-token", `{"item":"book"}`)
	if code != 201 || h.Get(idempotency.ReplayedHeader) != "" {
		t.Fatalf("POST: %d %s", code, first)
	}
	if code, h, again := do("POST", "/orders", "k1", "alice-token", `{"item":"book"}`); code != 201 || again != first || h.Get(idempotency.ReplayedHeader) != "true" {
		t.Fatalf("POST again: %d %v %s", code, h, again)
	}
	if code, h, bob := do("POST", "/orders", "k1", "bob-token", `{"item":"book"}`); code != 201 || bob == first || h.Get(idempotency.ReplayedHeader) != "" {
		t.Fatalf("bob, same key: %d %s", code, bob)
	}
	if code, _, body := do("GET", "/orders/1", "", "alice-token", ""); code != 200 || !strings.Contains(body, "book") {
		t.Errorf("GET without a key: %d %s", code, body)
	}
	// chi answers HEAD and OPTIONS itself here (405): what matters is that the
	// middleware let them through instead of asking for a key.
	for _, method := range []string{"HEAD", "OPTIONS"} {
		if code, _, _ := do(method, "/orders/1", "", "alice-token", ""); code == 400 {
			t.Errorf("%s without a key: 400", method)
		}
	}
	if n := pgdeduptest.Count(t, db.Pool, `SELECT count(*) FROM orders`); n != 2 {
		t.Fatalf("%d orders, want alice's and bob's", n)
	}
}
