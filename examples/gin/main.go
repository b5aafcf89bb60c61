// Command gin is an orders API on gin whose writes are made idempotent by
// pgdedup's idempotency middleware through contrib/pgdedupgin, for a group of
// routes, after authentication:
//
//	api := r.Group("/", authenticate)
//	api.Use(pgdedupgin.Middleware(mw)) // POST, PUT, PATCH, DELETE need an Idempotency-Key
//	api.POST("/orders", createOrder)
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

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/contrib/pgdedupgin"
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
	r, err := newRouter(ctx, pool, []byte(os.Getenv("IDEMPOTENCY_SECRET")))
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(r.Run(cmp.Or(os.Getenv("ADDR"), "127.0.0.1:8080")))
}

// newRouter creates the orders table if needed and returns the API.
func newRouter(ctx context.Context, pool *pgxpool.Pool, secret []byte) (*gin.Engine, error) {
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
	r := gin.New()
	r.Use(gin.Recovery())
	r.GET(idempotency.DefaultDocsURL, gin.WrapH(mw.Docs()))
	api := r.Group("/", authenticate)
	api.Use(pgdedupgin.Middleware(mw))
	api.POST("/orders", createOrder)
	return r, nil
}

func createOrder(c *gin.Context) {
	var in struct {
		Item string `json:"item" binding:"required"`
	}
	if err := c.ShouldBindJSON(&in); err != nil {
		c.JSON(http.StatusBadRequest, gin.H{"error": `want {"item": "..."}`})
		return
	}
	ctx := c.Request.Context()
	var id int64
	err := idempotency.Tx(ctx).QueryRow(ctx,
		`INSERT INTO orders (owner, item) VALUES ($1, $2) RETURNING id`, userFrom(ctx), in.Item).Scan(&id)
	if err != nil {
		_ = c.AbortWithError(http.StatusInternalServerError, err) // rolled back: a retry runs again
		return
	}
	c.Header("Location", fmt.Sprintf("/orders/%d", id))
	c.JSON(http.StatusCreated, gin.H{"id": id, "item": in.Item})
}

type userKey struct{}

// authenticate verifies the bearer token and puts its user in the request's
// context, where the middleware's Scope reads it. It stands for real
// authentication; what matters is that it runs first.
func authenticate(c *gin.Context) {
	user, ok := tokens[strings.TrimPrefix(c.GetHeader("Authorization"), "Bearer ")]
	if !ok {
		c.AbortWithStatus(http.StatusUnauthorized)
		return
	}
	c.Request = c.Request.WithContext(context.WithValue(c.Request.Context(), userKey{}, user))
	c.Next()
}

var tokens = map[string]string{"alice-token": "alice", "bob-token": "bob"} // a demo's token table

func userFrom(ctx context.Context) string {
	user, _ := ctx.Value(userKey{}).(string)
	return user
}
