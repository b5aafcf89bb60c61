package pgdedupgin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/contrib/pgdedupgin"
	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

func init() { gin.SetMode(gin.ReleaseMode) }

// api is a gin router with POST /orders behind authentication and Middleware.
// The handler inserts an order in the middleware's transaction, and its item
// chooses a failure. "error" records c.Error and answers nothing, and "abort"
// answers c.AbortWithStatus(502), both after the INSERT. gate, when set, holds
// each call until it receives.
type api struct {
	pool    *pgxpool.Pool
	url     string
	calls   atomic.Int32
	after   atomic.Int32 // calls of a handler after the one that answers
	entered chan struct{}
	gate    chan struct{}
	reading chan struct{} // receives when a request with X-Test-Watch starts reading its body
}

func newAPI(t *testing.T) *api { return newAPIWith(t, idempotency.Config{}) }

// newAPIWith is newAPI with cfg's settings besides the Store, Scope and Secret.
func newAPIWith(t *testing.T, cfg idempotency.Config) *api {
	t.Helper()
	db := pgdeduptest.New(t)
	pgdeduptest.Exec(t, db.Pool, `CREATE TABLE orders (id bigserial PRIMARY KEY, owner text NOT NULL, item text NOT NULL)`)
	cfg.Store = pgdedup.Config{Consumer: "orders-api"}
	cfg.Scope = func(r *http.Request) string { return r.Header.Get("X-Test-User") } // a test's stand-in for authentication
	cfg.Secret = []byte("pgdedupgin test secret of 32+ bytes!")
	mw, err := idempotency.New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := &api{pool: db.Pool, reading: make(chan struct{}, 8)}
	r := gin.New()
	g := r.Group("/")
	g.Use(a.watchBody, pgdedupgin.Middleware(mw))
	g.POST("/orders", a.create, func(*gin.Context) { a.after.Add(1) })
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	a.url = srv.URL
	return a
}

// watchBody reports on a.reading when a request with an X-Test-Watch header
// starts reading its body.
func (a *api) watchBody(c *gin.Context) {
	if c.GetHeader("X-Test-Watch") != "" {
		c.Request.Body = &firstRead{ReadCloser: c.Request.Body, report: func() { a.reading <- struct{}{} }}
	}
}

// firstRead calls report on the first Read.
type firstRead struct {
	io.ReadCloser
	once   sync.Once
	report func()
}

func (f *firstRead) Read(p []byte) (int, error) {
	f.once.Do(f.report)
	return f.ReadCloser.Read(p)
}

func (a *api) create(c *gin.Context) {
	a.calls.Add(1)
	if a.entered != nil {
		a.entered <- struct{}{}
		<-a.gate
	}
	var in struct{ Item string }
	if err := c.BindJSON(&in); err != nil {
		return // BindJSON answered 400
	}
	ctx := c.Request.Context()
	var id int64
	if err := idempotency.Tx(ctx).QueryRow(ctx, `INSERT INTO orders (owner, item) VALUES ($1, $2) RETURNING id`,
		c.GetHeader("X-Test-User"), in.Item).Scan(&id); err != nil {
		_ = c.AbortWithError(http.StatusInternalServerError, err)
		return
	}
	switch in.Item {
	case "error":
		_ = c.Error(fmt.Errorf("supplier unavailable"))
	case "abort":
		c.AbortWithStatus(http.StatusBadGateway)
	default:
		c.JSON(http.StatusCreated, gin.H{"id": id, "item": in.Item})
	}
}

type reply struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, url, key, body string) reply {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/orders", strings.NewReader(body))
	req.Header.Set("X-Test-User", "alice")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

func (r reply) replayed() bool { return r.header.Get(idempotency.ReplayedHeader) == "true" }

func (r reply) problem() string {
	var p struct{ Type string }
	_ = json.Unmarshal([]byte(r.body), &p)
	return p.Type
}

func TestReplay(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	first := post(t, a.url, "k1", `{"item":"book"}`)
	if first.status != http.StatusCreated || first.replayed() {
		t.Fatalf("first: %+v", first)
	}
	for range 2 {
		if r := post(t, a.url, "k1", `{"item":"book"}`); r.status != 201 || r.body != first.body || !r.replayed() {
			t.Fatalf("retry: %+v, want %q replayed", r, first.body)
		}
	}
	if r := post(t, a.url, "k1", `{"item":"pen"}`); r.status != 422 || !strings.HasSuffix(r.problem(), "#key-reused") {
		t.Fatalf("same key, other body: %+v", r)
	}
	if r := post(t, a.url, "", `{"item":"book"}`); r.status != 400 || !strings.HasSuffix(r.problem(), "#missing-key") {
		t.Fatalf("no key: %+v", r)
	}
	if n := pgdeduptest.Count(t, a.pool, `SELECT count(*) FROM orders`); n != 1 || a.calls.Load() != 1 || a.after.Load() != 1 {
		t.Fatalf("%d orders, %d handler calls, %d calls after it; want 1, 1, 1 (a replay or a refusal runs no handler)",
			n, a.calls.Load(), a.after.Load())
	}
}

func TestConflictWhileInFlight(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.entered, a.gate = make(chan struct{}), make(chan struct{})
	done := make(chan reply, 1)
	go func() { done <- post(t, a.url, "k", `{"item":"lamp"}`) }()
	<-a.entered // the first request holds the key
	dup := post(t, a.url, "k", `{"item":"lamp"}`)
	if dup.status != http.StatusConflict || !strings.HasSuffix(dup.problem(), "#key-in-flight") || dup.header.Get("Retry-After") == "" {
		t.Fatalf("same key while the first runs: %+v", dup)
	}
	close(a.gate)
	first := <-done
	if first.status != 201 {
		t.Fatalf("first: %+v", first)
	}
	if r := post(t, a.url, "k", `{"item":"lamp"}`); !r.replayed() || r.body != first.body {
		t.Fatalf("after the first: %+v", r)
	}
	if n := pgdeduptest.Count(t, a.pool, `SELECT count(*) FROM orders`); n != 1 || a.calls.Load() != 1 {
		t.Fatalf("%d orders, %d handler calls; want 1, 1", n, a.calls.Load())
	}
}

// A handler fails after its INSERT, with c.Error alone (gin would answer an
// empty 200) or with AbortWithStatus(502). The INSERT rolls back and a retry
// runs the handler again.
func TestFailuresRollBack(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	for _, item := range []string{"error", "abort"} {
		want := map[string]int{"error": 500, "abort": 502}[item]
		for i := range 2 {
			if r := post(t, a.url, "k-"+item, `{"item":"`+item+`"}`); r.status != want || r.replayed() {
				t.Fatalf("%s, try %d: %+v, want %d", item, i+1, r, want)
			}
		}
	}
	if n := pgdeduptest.Count(t, a.pool, `SELECT count(*) FROM orders`); n != 0 || a.calls.Load() != 4 {
		t.Fatalf("%d orders, %d handler calls; want 0, 4", n, a.calls.Load())
	}
}

// Safe methods pass through, with no key needed and no transaction.
func TestSafeMethodPassesThrough(t *testing.T) {
	t.Parallel()
	db := pgdeduptest.New(t)
	mw, err := idempotency.New(db.Pool, idempotency.Config{GlobalScope: true, Secret: []byte("pgdedupgin test secret of 32+ bytes!")})
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	r.Use(pgdedupgin.Middleware(mw))
	r.GET("/ping", func(c *gin.Context) { c.String(200, "tx=%v", idempotency.Tx(c.Request.Context()) != nil) })
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequestWithContext(context.Background(), "GET", "/ping", nil))
	if w.Code != 200 || w.Body.String() != "tx=false" {
		t.Fatalf("GET: %d %s", w.Code, w.Body)
	}
}

// A handler that panics after its INSERT is rolled back, and gin.Recovery,
// mounted before Middleware, answers 500 to the client.
func TestPanicRollsBackAndRecoveryAnswers(t *testing.T) {
	t.Parallel()
	db := pgdeduptest.New(t)
	pgdeduptest.Exec(t, db.Pool, `CREATE TABLE orders (id bigserial PRIMARY KEY, owner text NOT NULL, item text NOT NULL)`)
	mw, err := idempotency.New(db.Pool, idempotency.Config{GlobalScope: true, Secret: []byte("pgdedupgin test secret of 32+ bytes!")})
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	r.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, _ any) { c.AbortWithStatus(http.StatusInternalServerError) }))
	r.Use(pgdedupgin.Middleware(mw))
	r.POST("/orders", func(c *gin.Context) {
		ctx := c.Request.Context()
		if _, err := idempotency.Tx(ctx).Exec(ctx, `INSERT INTO orders (owner, item) VALUES ('alice', 'book')`); err != nil {
			t.Error(err)
		}
		panic("bug")
	})
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	for i := range 2 {
		if rep := post(t, srv.URL, "k", `{}`); rep.status != http.StatusInternalServerError || rep.replayed() {
			t.Fatalf("try %d: %+v, want gin.Recovery's 500", i+1, rep)
		}
	}
	if n := pgdeduptest.Count(t, db.Pool, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("%d orders committed by a handler that panicked", n)
	}
}
