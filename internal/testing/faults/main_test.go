package faults

import (
	"context"
	"fmt"
	"os"
	"sync"
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
// fresh. On the partitioned table it first waits for the cleaner to seal 2
// partitions, so that the claims cross seals. Some are claimed one by one
// with sent, the time of their first sending, as bounded claims.
func assertStillDuplicates(t *testing.T, pool *pgxpool.Pool, consumer string, ids []string, cleaner *CleanerLoad, sent time.Time) {
	t.Helper()
	cleaner.WaitSealed(t)
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: consumer, SentAtMargin: sentAtMargin})
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
	// A broker's redelivery keeps the message's time: bounded claims of
	// every tenth ID, after the seals.
	for i := 0; i < len(ids); i += 10 {
		if claimed, err := store.Claim(ctx, tx, ids[i], pgdedup.WithSentAt(sent)); err != nil || claimed {
			t.Fatalf("a redelivery of %q with its time: claimed=%v err=%v, want a duplicate", ids[i], claimed, err)
		}
	}
}

// errLog keeps the first errors a scenario's deliveries returned, so that a
// scenario which ran out of time says what its deliveries met.
type errLog struct {
	mu    sync.Mutex
	n     int
	first []string
}

func (l *errLog) add(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	if len(l.first) < 5 {
		l.first = append(l.first, time.Now().Format("15:04:05.000")+" "+err.Error())
	}
}

// count is how many errors were added.
func (l *errLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

func (l *errLog) log(t *testing.T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n > 0 {
		t.Logf("%d deliveries returned an error; the first: %q", l.n, l.first)
	}
}
