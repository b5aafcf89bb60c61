// Package pgtest is the repository's own test kit: what the public
// [pgdeduptest] gives (a migrated schema per test, Exec, Count, HoldClaim),
// under the names the root, idempotency and internal tests use, plus helpers
// only they need (seeding, fan-out, the goose CLI, the wire proxy, captured
// logs, throwaway clusters).
package pgtest

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

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

// ForPartitionedExample is [ForExample] for an Example of the Partitioned
// layout: the table is migrated but never distributed, even with
// TEST_CITUS_DISTRIBUTE set (Setup refuses a distributed table; on Citus the
// example runs on the coordinator's own table).
func ForPartitionedExample() (*pgxpool.Pool, func()) {
	t := &exampleTB{}
	db := NewUnmigrated(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	if err := pgdedup.Migrate(context.Background(), sqlDB); err != nil {
		t.cleanup()
		panic(fmt.Sprintf("pgtest: migrate %s: %v", db.Schema, err))
	}
	return db.Pool, t.cleanup
}

// exampleTB is the part of testing.TB that NewUnmigrated uses, for Example
// functions: failures panic, cleanups run when the example calls cleanup.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (e *exampleTB) Helper()                   {}
func (e *exampleTB) Cleanup(f func())          { e.cleanups = append(e.cleanups, f) }
func (e *exampleTB) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (e *exampleTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (e *exampleTB) Errorf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }

func (e *exampleTB) cleanup() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}
