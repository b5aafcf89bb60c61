package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// chargeAPI is the handler under test: POST {"order": "...", "amount": N}
// inserts a charge in the middleware's transaction and answers 201 with the
// charge, including a timestamp, so a handler run twice answers different bytes.
type chargeAPI struct {
	calls    atomic.Int32
	failNext atomic.Int32  // how many of the next calls answer 500 after writing
	panics   atomic.Bool   // the next call panics after writing
	gate     chan struct{} // when set, each call waits for a value from it
	entered  chan struct{} // when set, each call sends to it on entry
	bodySize atomic.Int32  // when set, the answer's body is padded to this size
}

func (a *chargeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.calls.Add(1)
	if a.entered != nil {
		a.entered <- struct{}{}
	}
	if a.gate != nil {
		<-a.gate
	}
	var in struct {
		Order  string `json:"order"`
		Amount int    `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, "bad JSON: "+err.Error(), http.StatusBadRequest)
		return
	}
	tx := idempotency.Tx(r.Context())
	var id int64
	err := tx.QueryRow(r.Context(), `INSERT INTO charges (order_id, amount) VALUES ($1, $2) RETURNING id`, in.Order, in.Amount).Scan(&id)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if a.panics.CompareAndSwap(true, false) {
		panic(http.ErrAbortHandler)
	}
	if a.failNext.Add(-1) >= 0 {
		http.Error(w, "payment provider unavailable", http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/charges/%d", id))
	w.Header().Set("X-Handled-At", time.Now().Format(time.RFC3339Nano)) // not a replay header
	w.WriteHeader(http.StatusCreated)
	body := fmt.Sprintf(`{"id":%d,"order":%q,"amount":%d,"at":%q}`, id, in.Order, in.Amount, time.Now().Format(time.RFC3339Nano))
	if size := int(a.bodySize.Load()); size > len(body) {
		body += strings.Repeat(" ", size-len(body))
	}
	fmt.Fprint(w, body)
}

func newAPI(bodySize int32) *chargeAPI {
	a := &chargeAPI{}
	a.bodySize.Store(bodySize)
	return a
}

type bundle struct {
	db   *pgtest.DB
	pool *pgxpool.Pool
	mw   *idempotency.Middleware
	api  *chargeAPI
	url  string
}

// testSecret is the tests' Config.Secret.
var testSecret = []byte("test secret: 32 bytes or more, never a real one")

// withDefaults fills in what every test's Config needs: the test secret and,
// unless the test chose, a Scope from the verified user (see authenticate).
func withDefaults(cfg idempotency.Config) idempotency.Config {
	if cfg.Secret == nil {
		cfg.Secret = testSecret
	}
	if cfg.Scope == nil && !cfg.GlobalScope {
		cfg.Scope = userScope
	}
	return cfg
}

func setup(t *testing.T, cfg idempotency.Config, api *chargeAPI) *bundle {
	t.Helper()
	db := pgtest.New(t)
	return setupOn(t, db, db.Pool, cfg, api)
}

// setupOn is setup on db, the middleware using pool.
func setupOn(t *testing.T, db *pgtest.DB, pool *pgxpool.Pool, cfg idempotency.Config, api *chargeAPI) *bundle {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(),
		`CREATE TABLE IF NOT EXISTS charges (id bigserial PRIMARY KEY, order_id text NOT NULL, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	mw, err := idempotency.New(pool, withDefaults(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if api == nil {
		api = &chargeAPI{}
	}
	mux := http.NewServeMux()
	mux.Handle("POST /charges", mw.Wrap(api))
	mux.Handle("GET "+idempotency.DefaultDocsURL, mw.Docs())
	srv := httptest.NewUnstartedServer(authenticate(mux))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic test's recovered panic
	srv.Start()
	t.Cleanup(srv.Close)
	return &bundle{db: db, pool: db.Pool, mw: mw, api: api, url: srv.URL + "/charges"}
}

// tokens are the bearer tokens authenticate accepts, and whose they are.
var tokens = map[string]string{"alice-token": "alice", "bob-token": "bob"}

type userKey struct{}

// authenticate is the tests' authentication middleware, which runs before the
// idempotency middleware: it verifies the bearer token and puts its user in
// the request's context. A request without a valid token goes on without one.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if user, ok := tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]; ok {
			r = r.WithContext(context.WithValue(r.Context(), userKey{}, user))
		}
		next.ServeHTTP(w, r)
	})
}

// userScope is Config.Scope from the verified user: "" without one.
func userScope(r *http.Request) string {
	user, _ := r.Context().Value(userKey{}).(string)
	return user
}

// reply is what a client received.
type reply struct {
	status int
	header http.Header
	body   string
}

func (r reply) replayed() bool { return r.header.Get(idempotency.ReplayedHeader) == "true" }

func (r reply) String() string { return fmt.Sprintf("%d %v %q", r.status, r.header, r.body) }

// post sends body to url with the given key ("" for none) and extra headers
// as name, value pairs, as alice unless an Authorization header is given.
func post(t *testing.T, url, key, body string, headers ...string) reply {
	t.Helper()
	r, err := send(url, key, body, headers...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// send posts on a connection of its own (freshConns). Go's http.Transport
// resends a request that has an Idempotency-Key header when a reused
// connection fails, and on a loaded machine (CI) such a resend of a first
// request met the first still running and got 409.
func send(url, key, body string, headers ...string) (reply, error) {
	return sendWith(freshConns, url, key, body, headers...)
}

// freshConns opens a connection per request, so its Transport never resends.
var freshConns = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

func sendWith(c *http.Client, url, key, body string, headers ...string) (reply, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Authorization", "Bearer alice-token") // unless headers say otherwise
	for i := 0; i+1 < len(headers); i += 2 {
		if http.CanonicalHeaderKey(headers[i]) == "Authorization" {
			req.Header.Del("Authorization")
		}
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}, err
}

func charges(t *testing.T, pool *pgxpool.Pool) int {
	return pgtest.Count(t, pool, `SELECT count(*) FROM charges`)
}

// keys returns how many idempotency keys are recorded.
func keys(t *testing.T, pool *pgxpool.Pool) int {
	return pgtest.Count(t, pool, `SELECT count(*) FROM processed_messages`)
}

// isProblem reports whether r is one of the middleware's problem answers. An
// answer about the key's use (400, 409, 413, 422) must also point to the
// documentation (draft §2.7): a problem type in DefaultDocsURL's page and a
// Link to it with rel="describedby".
func isProblem(r reply, status int) bool {
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	ok := r.status == status && r.header.Get("Content-Type") == idempotency.ProblemContentType &&
		json.Unmarshal([]byte(r.body), &p) == nil && p.Status == status && p.Detail != ""
	if status >= 500 {
		return ok && p.Type == "about:blank"
	}
	return ok && strings.HasPrefix(p.Type, idempotency.DefaultDocsURL+"#") &&
		r.header.Get("Link") == "<"+idempotency.DefaultDocsURL+`>; rel="describedby"; type="text/html"`
}
