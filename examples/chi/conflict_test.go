package main

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/pgdedup/pgdedup/examples/internal/apitest"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// A replay, 422 for a reused key and 409 for a key in flight, through chi.
func TestChiReplayAndConflict(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	router, err := newRouter(context.Background(), db.Pool, []byte("chi example test secret of 32+ bytes"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(router)
	t.Cleanup(srv.Close)
	apitest.ReplayAndConflict(t, db.Pool, srv.URL)
}
