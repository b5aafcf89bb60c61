package faults

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
)

// TestMain turns the test binary into a crash-prone consumer process when the
// crash scenario starts it with PGDEDUP_FAULTS_RECIPE set.
func TestMain(m *testing.M) {
	if recipe := os.Getenv(envRecipe); recipe != "" {
		os.Exit(runConsumer(recipe))
	}
	os.Exit(m.Run())
}

// soak reports whether PGDEDUP_SOAK=1 asks for the long runs; by default each
// scenario takes a few seconds, to fit CI.
func soak() bool { return os.Getenv("PGDEDUP_SOAK") == "1" }

// scaled returns n, or n times 10 in soak mode.
func scaled(n int) int {
	if soak() {
		return n * 10
	}
	return n
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	if soak() {
		d *= 10
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func messageIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	return ids
}

// assertExactlyOnce fails t unless every message had exactly one effect.
func assertExactlyOnce(t *testing.T, tally Tally) {
	t.Helper()
	if tally.Once != tally.Messages || tally.Lost != 0 || tally.Doubled != 0 || tally.Unexpected != 0 {
		t.Errorf("not exactly once: %s", tally)
	}
}

// assertStillDuplicates fails t unless every one of ids is still recorded for
// consumer: claimed again, inside a transaction that is rolled back, none is
// fresh.
func assertStillDuplicates(t *testing.T, pool *pgxpool.Pool, consumer string, ids []string) {
	t.Helper()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: consumer})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the claims must not stay
	fresh, err := store.ClaimBatch(ctx, tx, ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(fresh) != 0 {
		t.Errorf("%d of %d processed IDs are no longer recorded, e.g. %q", len(fresh), len(ids), fresh[0])
	}
}
