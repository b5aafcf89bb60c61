package pgdedup_test

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// Four cleaners at once (Stores of different consumers: Cleanup is for the
// whole table) finish without error or deadlock and delete each row once.
func TestCleanupConcurrentCleaners(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	pgtest.Seed(t, b.pool, "billing", "old-", 30_000, -time.Hour)
	pgtest.Seed(t, b.pool, "emails", "old-", 30_000, -time.Hour)
	pgtest.Seed(t, b.pool, "emails", "live-", 100, time.Hour)

	var total atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 4 {
		store, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: fmt.Sprint("cleaner-", i), CleanupBatchSize: 500})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			<-start
			n, err := store.Cleanup(ctx)
			if err != nil {
				t.Errorf("cleaner %d: %v", i, err)
			}
			total.Add(n)
		})
	}
	close(start)
	wg.Wait()
	if n := total.Load(); n != 60_000 {
		t.Errorf("cleaners deleted %d rows in total, want 60000", n)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 100 {
		t.Errorf("%d rows left, want the 100 live ones", n)
	}
}

// Cleanup running while 8 goroutines Process new and duplicate IDs: no error,
// every ID recorded, every order charged exactly once.
func TestCleanupWhileProcessing(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	cleaning := make(chan struct{})
	var once sync.Once
	sink := &logSink{onBatch: func(int64) { once.Do(func() { close(cleaning) }) }}
	b := setup(t, pgdedup.Config{CleanupBatchSize: 500, Logger: slog.New(sink)})
	const orders = 300
	pgtest.Seed(t, b.pool, "billing", "old-", 20_000, -time.Hour)
	// The same IDs, expired, for another consumer: neighbours of the new claims
	// in the primary key index.
	pgtest.Seed(t, b.pool, "billing-v1", "order-", orders, -time.Hour)

	deliveries := make(chan string, 3*orders)
	var ids []string
	for i := range 3 * orders {
		ids = append(ids, pgtest.SeedID("order-", i%orders+1))
	}
	rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	for _, id := range ids {
		deliveries <- id
	}
	close(deliveries)

	var deleted int64
	stop, cleanerDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(cleanerDone)
		for {
			n, err := b.store.Cleanup(ctx)
			deleted += n
			if err != nil {
				t.Errorf("Cleanup: %v", err)
				return
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	select { // the workers start while the first run is mid-way
	case <-cleaning:
	case <-cleanerDone:
		t.Fatal("the cleaner stopped before its first batch")
	}
	var processed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for id := range deliveries {
				ok, err := b.store.Process(ctx, id, charge(id))
				if err != nil {
					t.Errorf("Process(%s): %v", id, err)
				}
				if ok {
					processed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-cleanerDone

	if n := processed.Load(); n != orders {
		t.Errorf("%d deliveries processed, want %d", n, orders)
	}
	charges := chargesPerOrder(t, b.pool)
	for i := 1; i <= orders; i++ {
		id := pgtest.SeedID("order-", i)
		if charges[id] != 1 || !recorded(t, b.pool, "billing", id) {
			t.Errorf("%s: charged %d times, recorded %v; want once, true", id, charges[id], recorded(t, b.pool, "billing", id))
		}
	}
	if deleted != 20_000+orders {
		t.Errorf("cleaner deleted %d rows, want %d", deleted, 20_000+orders)
	}
}
