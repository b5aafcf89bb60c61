package pgdedupgin_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/contrib/pgdedupgin"
	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// A gin route's handler writes in the middleware's transaction. The retry
// gets the first answer replayed and inserts nothing.
func ExampleMiddleware() {
	ctx := context.Background()
	pool, done := pgdeduptest.ForExample()
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.New(pool, idempotency.Config{
		Store:       pgdedup.Config{Consumer: "orders-api"},
		GlobalScope: true, // an example's shortcut, as a real API sets Scope from its authentication
		Secret:      []byte("example secret, 32 random bytes in real life"),
	})
	if err != nil {
		log.Fatal(err)
	}
	r := gin.New()
	r.POST("/orders", pgdedupgin.Middleware(mw), func(c *gin.Context) {
		var id int64
		ctx := c.Request.Context()
		if err := idempotency.Tx(ctx).QueryRow(ctx, `INSERT INTO orders (item) VALUES ('book') RETURNING id`).Scan(&id); err != nil {
			_ = c.AbortWithError(http.StatusInternalServerError, err)
			return
		}
		c.JSON(http.StatusCreated, gin.H{"id": id})
	})
	for range 2 {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "order-form-7")
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Body.String(), "replayed:", w.Header().Get(idempotency.ReplayedHeader) == "true")
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// 201 {"id":1} replayed: false
	// 201 {"id":1} replayed: true
	// orders: 1
}
