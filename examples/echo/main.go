// Command echo is an orders API on Echo (v4) whose writes are made idempotent
// by pgdedup's idempotency middleware, per route, after authentication:
//
//	e.POST("/orders", createOrder, authenticate, idempotent(mw))
//
// idempotent adapts the net/http middleware to Echo. Echo's own
// echo.WrapMiddleware(mw.Wrap) is not enough: an Echo handler that returns an
// error leaves its answer to Echo's error handler, which runs only after the
// wrapped middleware has returned. The middleware would then see a handler
// that answered nothing, commit its writes and keep an empty 200 for every
// retry. idempotent hands the error to c.Error inside the middleware, so the
// error's status decides: a 5xx rolls back and a retry runs the handler again.
//
// Settings come from DATABASE_URL, IDEMPOTENCY_SECRET (32 or more random
// bytes) and ADDR (default 127.0.0.1:8080).
package main

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

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
	e, err := newServer(ctx, pool, []byte(os.Getenv("IDEMPOTENCY_SECRET")))
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(e.Start(cmp.Or(os.Getenv("ADDR"), "127.0.0.1:8080")))
}

// newServer creates the orders table if needed and returns the API.
func newServer(ctx context.Context, pool *pgxpool.Pool, secret []byte) (*echo.Echo, error) {
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
	e := echo.New()
	e.HideBanner = true
	e.Use(middleware.Recover()) // a panicking handler: rolled back by the middleware, answered 500 here
	e.GET(idempotency.DefaultDocsURL, echo.WrapHandler(mw.Docs()))
	e.POST("/orders", createOrder, authenticate, idempotent(mw))
	return e, nil
}

// idempotent runs the rest of the chain inside mw: in its transaction
// (idempotency.Tx(c.Request().Context())), with its answer buffered, stored
// and replayed by mw. A returned error is answered by Echo's error handler
// inside mw, so that its status is the one mw sees.
func idempotent(mw *idempotency.Middleware) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			outer := c.Response()
			defer c.SetResponse(outer)
			mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c.SetRequest(r)
				c.SetResponse(echo.NewResponse(w, c.Echo()))
				if err := next(c); err != nil {
					c.Error(err)
				}
			})).ServeHTTP(outer, c.Request())
			return nil
		}
	}
}

func createOrder(c echo.Context) error {
	var in struct {
		Item string `json:"item"`
	}
	if err := c.Bind(&in); err != nil || in.Item == "" {
		return echo.NewHTTPError(http.StatusBadRequest, `want {"item": "..."}`)
	}
	ctx := c.Request().Context()
	var id int64
	err := idempotency.Tx(ctx).QueryRow(ctx,
		`INSERT INTO orders (owner, item) VALUES ($1, $2) RETURNING id`, userFrom(ctx), in.Item).Scan(&id)
	if err != nil {
		return err // 500 through c.Error: rolled back, a retry runs again
	}
	if in.Item == "broken" { // a failure after the write, for the tests
		return echo.NewHTTPError(http.StatusBadGateway, "supplier unavailable")
	}
	c.Response().Header().Set("Location", fmt.Sprintf("/orders/%d", id))
	return c.JSON(http.StatusCreated, map[string]any{"id": id, "item": in.Item})
}

type userKey struct{}

// authenticate verifies the bearer token and puts its user in the request's
// context, where the middleware's Scope reads it. It stands for real
// authentication; what matters is that it runs first.
func authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		user, ok := tokens[strings.TrimPrefix(c.Request().Header.Get("Authorization"), "Bearer ")]
		if !ok {
			return echo.NewHTTPError(http.StatusUnauthorized)
		}
		c.SetRequest(c.Request().WithContext(context.WithValue(c.Request().Context(), userKey{}, user)))
		return next(c)
	}
}

var tokens = map[string]string{"alice-token": "alice", "bob-token": "bob"} // a demo's token table

func userFrom(ctx context.Context) string {
	user, _ := ctx.Value(userKey{}).(string)
	return user
}
