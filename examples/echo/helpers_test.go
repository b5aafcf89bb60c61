package main

import (
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/idempotency"
)

func middlewareFor(t *testing.T, pool *pgxpool.Pool) *idempotency.Middleware {
	t.Helper()
	mw, err := idempotency.New(pool, idempotency.Config{
		Store:  pgdedup.Config{Consumer: "orders-api-wrapped"},
		Scope:  func(r *http.Request) string { return userFrom(r.Context()) },
		Secret: []byte(secret),
	})
	if err != nil {
		t.Fatal(err)
	}
	return mw
}
