package idempotency_test

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup/idempotency"
)

// newBoundsMiddleware is BenchmarkDatabaseBounds's middleware, with the
// defaults of the bounds (MaxInFlight, AcquireTimeout, MaxWaitersPerKey).
func newBoundsMiddleware(pool *pgxpool.Pool, inFlightWait time.Duration) (*idempotency.Middleware, error) {
	return idempotency.New(pool, withDefaults(idempotency.Config{InFlightWait: inFlightWait}))
}
