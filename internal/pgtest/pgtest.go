// Package pgtest is the repository's own test kit: what the public
// [pgdeduptest] gives (a migrated schema per test, Exec, Count, HoldClaim),
// under the names the root, idempotency and internal tests use, plus helpers
// only they need (seeding, fan-out, the goose CLI, the wire proxy, captured
// logs, throwaway clusters).
package pgtest

import "github.com/pgdedup/pgdedup/pgdeduptest"

// DB is [pgdeduptest.DB].
type DB = pgdeduptest.DB

// Querier is [pgdeduptest.Querier].
type Querier = pgdeduptest.Querier

// The functions of [pgdeduptest], by the names used here.
var (
	New            = pgdeduptest.New
	NewUnmigrated  = pgdeduptest.NewUnmigrated
	URL            = pgdeduptest.URL
	ForExample     = pgdeduptest.ForExample
	Exec           = pgdeduptest.Exec
	Count          = pgdeduptest.Count
	CountBy        = pgdeduptest.CountBy
	HoldClaim      = pgdeduptest.HoldClaim
	CitusColumn    = pgdeduptest.CitusColumn
	PgBouncer      = pgdeduptest.PgBouncer
	WithSearchPath = pgdeduptest.WithSearchPath
)
