package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// BenchmarkMiddleware compares, in one process on one database, a request
// without a key (the handler in a plain transaction, the baseline), a request
// with a new key (claim, handler, stored response) and a replay.
func BenchmarkMiddleware(b *testing.B) {
	db := pgtest.New(b)
	if _, err := db.Pool.Exec(context.Background(), `CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	mw, err := idempotency.New(db.Pool, idempotency.Config{Optional: true, GlobalScope: true, Secret: testSecret})
	if err != nil {
		b.Fatal(err)
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var id int64
		if err := idempotency.Tx(r.Context()).QueryRow(r.Context(),
			`INSERT INTO orders (item) VALUES ('book') RETURNING id`).Scan(&id); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"item":"book"}`, id)
	}))
	do := func(b *testing.B, key string, want int) {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			b.Fatalf("%d %s", rec.Code, rec.Body)
		}
	}
	b.Run("no-key", func(b *testing.B) {
		for b.Loop() {
			do(b, "", 201)
		}
	})
	var n atomic.Int64 // keys stay new across -count runs
	b.Run("new-key", func(b *testing.B) {
		for b.Loop() {
			do(b, fmt.Sprintf("bench-%d", n.Add(1)), 201)
		}
	})
	b.Run("replay", func(b *testing.B) {
		do(b, "replayed", 201)
		for b.Loop() {
			do(b, "replayed", 201)
		}
	})
}
