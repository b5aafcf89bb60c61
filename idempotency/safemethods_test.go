package idempotency_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pgdedup/pgdedup/idempotency"
)

// Mounted in front of a whole router, the middleware lets the safe methods
// through without a key or a transaction, and keeps requiring keys on the
// others. (The same through chi's r.Use: examples/chi.)
func TestSafeMethodsPassThrough(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	h := func(w http.ResponseWriter, r *http.Request) {
		if idempotency.Tx(r.Context()) == nil {
			w.Header().Set("X-Tx", "none")
		}
		w.WriteHeader(http.StatusOK)
	}
	srv := httptest.NewServer(authenticate(b.mw.Wrap(http.HandlerFunc(h))))
	t.Cleanup(srv.Close)
	strict, err := idempotency.New(b.pool, withDefaults(idempotency.Config{SafeMethods: []string{}}))
	if err != nil {
		t.Fatal(err)
	}
	strictSrv := httptest.NewServer(authenticate(strict.Wrap(http.HandlerFunc(h))))
	t.Cleanup(strictSrv.Close)

	for _, method := range []string{"GET", "HEAD", "OPTIONS", "TRACE"} {
		req, _ := http.NewRequest(method, srv.URL+"/orders/1", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Tx") != "none" || resp.Header.Get(idempotency.ReplayedHeader) != "" {
			t.Errorf("%s without a key: %d %v", method, resp.StatusCode, resp.Header)
		}
		req, _ = http.NewRequest(method, strictSrv.URL+"/orders/1", nil)
		if resp, err = http.DefaultClient.Do(req); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("%s without a key, SafeMethods empty: %d", method, resp.StatusCode)
		}
	}
	for _, method := range []string{"POST", "PUT", "PATCH", "DELETE"} {
		req, _ := http.NewRequest(method, srv.URL+"/orders/1", strings.NewReader("{}"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("%s without a key: %d", method, resp.StatusCode)
		}
	}
	if keys(t, b.pool) != 0 {
		t.Fatalf("%d keys recorded", keys(t, b.pool))
	}
}
