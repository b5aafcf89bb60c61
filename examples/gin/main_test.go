package main

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/pgdedup/pgdedup/examples/internal/apitest"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// A replay, 422 for a reused key and 409 for a key in flight, through gin.
func TestGinReplayAndConflict(t *testing.T) {
	t.Parallel()
	gin.SetMode(gin.ReleaseMode)
	db := pgtest.New(t)
	r, err := newRouter(context.Background(), db.Pool, []byte("gin example test secret of 32+ bytes"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	apitest.ReplayAndConflict(t, db.Pool, srv.URL)
	if r := apitest.Post(t, srv.URL, "/orders", "bob-token", "k-replay", `{"item":"book"}`); r.Status != 201 || r.Replayed() {
		t.Fatalf("bob with alice's key: %d %s, want his own order", r.Status, r.Body)
	}
}
