// Command chi is an orders API on the chi router whose writes are made
// idempotent by pgdedup's idempotency middleware, mounted for the whole
// router with r.Use, after authentication:
//
//	r.Use(authenticate)  // verifies the caller: the middleware's Scope
//	r.Use(mw.Wrap)       // POST, PUT, PATCH, DELETE need an Idempotency-Key
//
// Reads (GET, HEAD, OPTIONS) and the documentation page pass through the
// middleware untouched: no key, no transaction.
//
// Settings come from DATABASE_URL, IDEMPOTENCY_SECRET (32 or more random
// bytes) and ADDR (default 127.0.0.1:8080).
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/idempotency"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if err := pgdedup.Migrate(ctx, stdlib.OpenDBFromPool(pool)); err != nil {
		log.Fatal(err)
	}
	router, err := newRouter(ctx, pool, []byte(os.Getenv("IDEMPOTENCY_SECRET")))
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(http.ListenAndServe(cmp.Or(os.Getenv("ADDR"), "127.0.0.1:8080"), router))
}

// newRouter creates the orders table if needed and returns the API.
func newRouter(ctx context.Context, pool *pgxpool.Pool, secret []byte) (http.Handler, error) {
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, owner text NOT NULL, item text NOT NULL)`); err != nil {
		return nil, err
	}
	mw, err := idempotency.New(pool, idempotency.Config{
		Store:  pgdedup.Config{Consumer: "orders-api"},
		Scope:  func(r *http.Request) string { return userFrom(r.Context()) },
		Secret: secret,
	})
	if err != nil {
		return nil, err
	}
	r := chi.NewRouter()
	r.Use(authenticate)
	r.Use(mw.Wrap)
	r.Get(idempotency.DefaultDocsURL, mw.Docs().ServeHTTP)
	r.Post("/orders", createOrder)
	r.Get("/orders/{id}", getOrder(pool))
	return r, nil
}

func createOrder(w http.ResponseWriter, r *http.Request) {
	var in struct{ Item string }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Item == "" {
		http.Error(w, `want {"item": "..."}`, http.StatusBadRequest)
		return
	}
	var id int64
	err := idempotency.Tx(r.Context()).QueryRow(r.Context(),
		`INSERT INTO orders (owner, item) VALUES ($1, $2) RETURNING id`, userFrom(r.Context()), in.Item).Scan(&id)
	if err != nil {
		http.Error(w, "try again", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "item": in.Item})
}

// getOrder reads from the pool: a GET gets no transaction from the middleware.
func getOrder(pool *pgxpool.Pool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var item string
		err := pool.QueryRow(r.Context(), `SELECT item FROM orders WHERE id = $1 AND owner = $2`,
			chi.URLParam(r, "id"), userFrom(r.Context())).Scan(&item)
		switch {
		case err == pgx.ErrNoRows:
			http.NotFound(w, r)
		case err != nil:
			http.Error(w, "try again", http.StatusInternalServerError)
		default:
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{"item": item})
		}
	}
}

type userKey struct{}

// authenticate verifies the bearer token and puts its user in the context.
// It stands for real authentication; what matters is that it runs first. The
// documentation page is public.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == idempotency.DefaultDocsURL {
			next.ServeHTTP(w, r)
			return
		}
		user, ok := tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		if !ok {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

var tokens = map[string]string{"alice-token": "alice", "bob-token": "bob"} // a demo's token table

func userFrom(ctx context.Context) string {
	user, _ := ctx.Value(userKey{}).(string)
	return user
}
