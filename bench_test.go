package pgdedup_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// Benchmarks for benchstat: go test -run '^$' -bench . -count 10 | tee new.txt.
// Those that touch SQL run against the real test database (see internal/pgtest);
// the side-by-side comparison with Redis and the bare transaction is the bench
// module (BENCHMARKS.md).

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

func BenchmarkContentKey(b *testing.B) {
	for _, n := range []int{256, 4096} {
		payload := []byte(strings.Repeat("x", n))
		b.Run(fmt.Sprintf("bytes=%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				_ = pgdedup.ContentKey(payload)
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
