package pgdedup_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// With 1-second partitions (testSpan) and RunCleaner once per span, as documented, a
// session idle in transaction with a lock on the table holds sealing up
// (each run waits for it) for longer than the partitions created ahead
// last. Claims go on meanwhile, and none finds no partition: creating
// partitions ahead never waits behind sealing.
func TestPartitionedCreationNeverWaitsForSealing(t *testing.T) {
	t.Parallel()
	span := testSpan(time.Second)
	b := setupPartitioned(t, pgdedup.Config{Retention: 10 * span, Partitions: 10})
	ctx := ctxT(t)
	cleaner, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "cleaner", Retention: 10 * span})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = cleaner.RunCleaner(runCtx, span) }()
	defer func() { stop(); wg.Wait() }()

	holder := newSession(t, b)
	tx, err := holder.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	mustExec(t, tx, `SELECT FROM processed_messages LIMIT 0`)
	// Past the partitions Setup made ahead (three, 3 to 4 spans), and more.
	var failed []string
	for i, end := 0, time.Now().Add(7*span); time.Now().Before(end); i++ {
		id := pgtest.SeedID("during-", i)
		if _, err := b.store.Process(ctx, id, charge(id)); err != nil {
			if strings.Contains(err.Error(), "no partition") {
				failed = append(failed, id)
				continue
			}
			t.Fatalf("Process %s: %v", id, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(failed) > 0 {
		t.Errorf("%d claims found no partition while sealing was held up, first %s", len(failed), failed[0])
	}
}
