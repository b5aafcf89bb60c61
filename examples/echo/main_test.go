package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/pgdedup/pgdedup/examples/internal/apitest"
	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

const secret = "echo example test secret of 32+ bytes"

func serve(t *testing.T) (*pgxpool.Pool, *echo.Echo, string) {
	t.Helper()
	db := pgtest.New(t)
	e, err := newServer(context.Background(), db.Pool, []byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	e.Logger.SetOutput(io.Discard) // Recover's stack traces
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return db.Pool, e, srv.URL
}

// A replay, 422 for a reused key and 409 for a key in flight, through Echo.
func TestEchoReplayAndConflict(t *testing.T) {
	t.Parallel()
	pool, _, url := serve(t)
	apitest.ReplayAndConflict(t, pool, url)
}

// A handler that returns an error after its INSERT: through idempotent, the
// error's 502 rolls the INSERT back and a retry runs the handler again. Through
// echo.WrapMiddleware(mw.Wrap), the same handler commits its INSERT with an
// empty 200 that every retry gets replayed: the failure is lost.
func TestEchoHandlerErrorRollsBack(t *testing.T) {
	t.Parallel()
	pool, e, url := serve(t)
	for i := range 2 {
		r := apitest.Post(t, url, "/orders", "alice-token", "k-broken", `{"item":"broken"}`)
		if r.Status != http.StatusBadGateway || r.Replayed() {
			t.Fatalf("try %d: %d %s, want the handler's 502, not a replay", i+1, r.Status, r.Body)
		}
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("%d orders committed by a failed handler", n)
	}

	// The same handler and middleware through Echo's generic wrapper.
	mw := middlewareFor(t, pool)
	e.POST("/wrapped/orders", createOrder, authenticate, echo.WrapMiddleware(mw.Wrap))
	first := apitest.Post(t, url, "/wrapped/orders", "alice-token", "k-wrapped", `{"item":"broken"}`)
	retry := apitest.Post(t, url, "/wrapped/orders", "alice-token", "k-wrapped", `{"item":"broken"}`)
	n := pgtest.Count(t, pool, `SELECT count(*) FROM orders`)
	t.Logf("echo.WrapMiddleware: first answer %d %q, retry %d replayed=%v, orders committed %d",
		first.Status, first.Body, retry.Status, retry.Replayed(), n)
	if n != 1 || retry.Status != http.StatusOK || !retry.Replayed() {
		t.Fatalf("echo.WrapMiddleware no longer commits a failed handler's write (%d orders, retry %d): update the doc of idempotent", n, retry.Status)
	}
}

// A handler that panics after its INSERT: rolled back, and Echo's Recover
// answers 500.
func TestEchoPanicRollsBack(t *testing.T) {
	t.Parallel()
	pool, e, url := serve(t)
	e.POST("/panics", func(c echo.Context) error {
		ctx := c.Request().Context()
		if _, err := idempotency.Tx(ctx).Exec(ctx, `INSERT INTO orders (owner, item) VALUES ('alice', 'book')`); err != nil {
			return err
		}
		panic("bug")
	}, authenticate, idempotent(middlewareFor(t, pool)))
	for i := range 2 {
		if r := apitest.Post(t, url, "/panics", "alice-token", "k", `{}`); r.Status != http.StatusInternalServerError || r.Replayed() {
			t.Fatalf("try %d: %d %s, want 500", i+1, r.Status, r.Body)
		}
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("%d orders committed by a handler that panicked", n)
	}
}
