package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// Benchmarks for benchstat: go test -run '^$' -bench . -count 10 | tee new.txt.
// Those that touch SQL run against the real test database (see internal/pgtest);
// the side-by-side comparison with Redis and the bare transaction is the bench
// module (go run -C bench .).

func BenchmarkValidateMessageID(b *testing.B) {
	for _, id := range []string{
		"6f1c2b9e-3d4a-4c8e-9a71-0b2f5e8d7c13",
		strings.Repeat("é", pgdedup.MaxMessageIDLen/2),
	} {
		b.Run(fmt.Sprintf("bytes=%d", len(id)), func(b *testing.B) {
			b.SetBytes(int64(len(id)))
			for b.Loop() {
				if err := pgdedup.ValidateMessageID(id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkMessageIDFromContent(b *testing.B) {
	for _, n := range []int{256, 4096} {
		payload := []byte(strings.Repeat("x", n))
		b.Run(fmt.Sprintf("bytes=%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				_ = pgdedup.MessageIDFromContent(payload)
			}
		})
	}
}

// BenchmarkClaim is one transaction per message: BEGIN, Claim, COMMIT.
func BenchmarkClaim(b *testing.B) {
	bb := benchSetup(b)
	ctx := context.Background()
	i := 0
	for b.Loop() {
		i++
		err := pgx.BeginFunc(ctx, bb.pool, func(tx pgx.Tx) error {
			claimed, err := bb.store.Claim(ctx, tx, fmt.Sprintf("claim-%d", i))
			if err == nil && !claimed {
				err = fmt.Errorf("new ID %d seen as a duplicate", i)
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkProcess is Process with an empty fn: BEGIN+claim pipelined, COMMIT.
func BenchmarkProcess(b *testing.B) {
	bb := benchSetup(b)
	ctx := context.Background()
	noop := func(context.Context, pgx.Tx) error { return nil }
	b.Run("new", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			if ok, err := bb.store.Process(ctx, fmt.Sprintf("new-%d", i), noop); err != nil || !ok {
				b.Fatal(ok, err)
			}
		}
	})
	b.Run("duplicate", func(b *testing.B) {
		if _, err := bb.store.Process(ctx, "dup", noop); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if ok, err := bb.store.Process(ctx, "dup", noop); err != nil || ok {
				b.Fatal(ok, err)
			}
		}
	})
}

// BenchmarkClaimBatch is one transaction per batch of new IDs: BEGIN,
// ClaimBatch, COMMIT. It reports IDs claimed per second.
func BenchmarkClaimBatch(b *testing.B) {
	bb := benchSetup(b)
	ctx := context.Background()
	for _, size := range []int{100, 1000} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			ids := make([]string, size)
			n := 0
			for b.Loop() {
				for j := range ids {
					n++
					ids[j] = fmt.Sprintf("batch-%d-%d", size, n)
				}
				err := pgx.BeginFunc(ctx, bb.pool, func(tx pgx.Tx) error {
					fresh, err := bb.store.ClaimBatch(ctx, tx, ids)
					if err == nil && len(fresh) != size {
						err = fmt.Errorf("%d of %d new IDs claimed", len(fresh), size)
					}
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "ids/s")
		})
	}
}

// benchSetup gives a benchmark a migrated schema of its own and a Store on it.
func benchSetup(b *testing.B) *bundle {
	b.Helper()
	db := pgtest.New(b)
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	return &bundle{db: db, pool: db.Pool, store: store}
}

// BenchmarkProcessLockTimeout compares Process of a new message without and
// with Config.LockTimeout, which adds the statements that set and restore
// lock_timeout to the claim's pipeline (no round trip).
func BenchmarkProcessLockTimeout(b *testing.B) {
	bb := benchSetup(b)
	ctx := context.Background()
	noop := func(context.Context, pgx.Tx) error { return nil }
	for _, lt := range []time.Duration{0, 5 * time.Second} {
		store, err := pgdedup.New(bb.pool, pgdedup.Config{Consumer: fmt.Sprint("lt-", lt), LockTimeout: lt})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("LockTimeout=%s", lt), func(b *testing.B) {
			for b.Loop() {
				if ok, err := store.Process(ctx, fmt.Sprintf("new-%d", benchSeq.Add(1)), noop); err != nil || !ok {
					b.Fatal(ok, err)
				}
			}
		})
	}
}

// benchSeq numbers the new IDs of benchmarks run with -count above 1.
var benchSeq atomic.Int64

// BenchmarkDuplicatesOfAStuckMessage measures what duplicates of a message
// whose first delivery is stuck in fn cost the rest of a small pool: a pool
// of 4, the first delivery holding its transaction for 2 s, 6 duplicates
// delivered meanwhile, then one unrelated message. It reports how long the
// unrelated message waited and the most connections the duplicates held,
// without and with Config.LockTimeout (a duplicate that gives up with
// ErrInFlight is requeued by its consumer after 100 ms and delivered again).
func BenchmarkDuplicatesOfAStuckMessage(b *testing.B) {
	db := pgtest.New(b)
	for _, lt := range []time.Duration{0, 500 * time.Millisecond} {
		b.Run(fmt.Sprintf("LockTimeout=%s", lt), func(b *testing.B) {
			pool := pgtest.Pool(b, db.URL, 4)
			store, err := pgdedup.New(pool, pgdedup.Config{Consumer: fmt.Sprint("stuck-", lt), LockTimeout: lt})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			var waited time.Duration
			var held int32
			n := 0
			for b.Loop() {
				n++
				id := fmt.Sprint("stuck-", n)
				started := make(chan struct{})
				var wg sync.WaitGroup
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _ = store.Process(ctx, id, func(context.Context, pgx.Tx) error {
						close(started)
						time.Sleep(2 * time.Second)
						return nil
					})
				}()
				<-started
				stop := time.Now().Add(2 * time.Second)
				for range 6 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for time.Now().Before(stop) {
							if _, err := store.Process(ctx, id, func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, pgdedup.ErrInFlight) {
								return
							}
							time.Sleep(100 * time.Millisecond)
						}
					}()
				}
				time.Sleep(200 * time.Millisecond)
				held = max(held, pool.Stat().AcquiredConns()-1)
				t0 := time.Now()
				if _, err := store.Process(ctx, fmt.Sprint("other-", n), func(context.Context, pgx.Tx) error { return nil }); err != nil {
					b.Fatal(err)
				}
				waited += time.Since(t0)
				wg.Wait()
			}
			b.ReportMetric(float64(waited.Milliseconds())/float64(n), "unrelated-wait-ms")
			b.ReportMetric(float64(held), "conns-held-by-duplicates")
		})
	}
}

// BenchmarkKeyCheck measures the opt-in CHECK that ties key to its columns
// (docs/operations.md, "Threat model"): batches of 1,000 new IDs claimed in
// one transaction, on a table without and with the constraint, side by side.
// The difference per ID is what every claim would pay for the constraint.
func BenchmarkKeyCheck(b *testing.B) {
	ctx := context.Background()
	for _, check := range []bool{false, true} {
		db := pgtest.New(b)
		if check {
			pgtest.Exec(b, db.Pool, `ALTER TABLE processed_messages ADD CONSTRAINT key_matches
CHECK (key = pgdedup_key(consumer, message_id)) NOT VALID`)
		}
		store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("check=%t", check), func(b *testing.B) {
			ids := make([]string, 1000)
			for b.Loop() {
				for i := range ids {
					ids[i] = fmt.Sprintf("key-check-%d", benchSeq.Add(1))
				}
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					fresh, err := store.ClaimBatch(ctx, tx, ids)
					if err == nil && len(fresh) != len(ids) {
						err = fmt.Errorf("%d of %d new IDs claimed", len(fresh), len(ids))
					}
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*len(ids)), "µs/ID")
		})
	}
}
