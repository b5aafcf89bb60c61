package main

import (
	"testing"

	"github.com/pgdedup/pgdedup/examples/internal/apitest"
)

// A replay, 422 for a reused key and 409 for a key in flight, through chi.
func TestChiReplayAndConflict(t *testing.T) {
	t.Parallel()
	db, url := serve(t)
	apitest.ReplayAndConflict(t, db.Pool, url)
}
