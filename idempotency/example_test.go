package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// A POST /orders endpoint that creates each order once per Idempotency-Key:
// the second request with the same key gets the first response, replayed.
func Example() {
	pool, done := pgtest.ForExample() // a migrated schema; use your own pool
	defer done()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		panic(err)
	}

	// Authentication runs first and puts the verified user in the context;
	// the middleware's Scope reads it there, so each user's keys are apart.
	type userKey struct{}
	tokens := map[string]string{"Bearer alice-token": "alice"} // your real verification
	authenticate := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			user, ok := tokens[r.Header.Get("Authorization")]
			if !ok {
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
		})
	}
	mw, err := idempotency.New(pool, idempotency.Config{
		Store: pgdedup.Config{Consumer: "orders-api"},
		Scope: func(r *http.Request) string {
			user, _ := r.Context().Value(userKey{}).(string)
			return user
		},
		Secret: exampleSecret, // 32 or more random bytes from your secret store
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", authenticate(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Item string }
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, "bad JSON", http.StatusBadRequest) // kept: the same request gets it again
			return
		}
		var id int64
		err := idempotency.Tx(r.Context()).QueryRow(r.Context(),
			`INSERT INTO orders (item) VALUES ($1) RETURNING id`, in.Item).Scan(&id)
		if err != nil {
			http.Error(w, "try again", http.StatusInternalServerError) // rolled back, not stored
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d,"item":%q}`+"\n", id, in.Item)
	}))))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Idempotency-Key", "order-7f3c")
		req.Header.Set("Authorization", "Bearer alice-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed=%q %s", resp.StatusCode, resp.Header.Get(idempotency.ReplayedHeader), body)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("orders:", n)
	// Output:
	// 201 replayed="" {"order":1,"item":"book"}
	// 201 replayed="true" {"order":1,"item":"book"}
	// orders: 1
}

// The error answers point to a page documenting the key's rules, which Docs
// serves from the Config (draft-ietf-httpapi-idempotency-key-header §2.7).
func ExampleMiddleware_Docs() {
	pool, done := pgtest.ForExample()
	defer done()
	mw, err := idempotency.New(pool, idempotency.Config{
		Store:       pgdedup.Config{Retention: 24 * time.Hour},
		GlobalScope: true, // one trusted caller; otherwise set Scope
		Secret:      exampleSecret,
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Wrap(http.NotFoundHandler()))
	mux.Handle("GET "+idempotency.DefaultDocsURL, mw.Docs())
	srv := httptest.NewServer(mux)
	defer srv.Close()

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", `"unterminated`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	var problem struct{ Type, Title, Detail string }
	_ = json.NewDecoder(resp.Body).Decode(&problem)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, resp.Header.Get("Link"))
	fmt.Println(problem.Type)
	fmt.Println(problem.Detail)

	resp, err = http.Get(srv.URL + idempotency.DefaultDocsURL)
	if err != nil {
		panic(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(strings.Contains(string(page), "kept for 24 hours"))
	// Output:
	// 400 </docs/idempotency-key>; rel="describedby"; type="text/html"
	// /docs/idempotency-key#invalid-key
	// Invalid Idempotency-Key header: the String has no closing quote.
	// true
}

// exampleSecret stands for Config.Secret, which comes from a secret store.
var exampleSecret = []byte("example only: 32+ random bytes from a secret store")
