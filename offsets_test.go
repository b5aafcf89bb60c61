package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
	"github.com/pgdedup/pgdedup/internal/wireproxy"
)

var orders = pgdedup.TopicPartition{Topic: "orders", Partition: 3}

// chargeOffsets is the business write of the offset tests: one charge per
// record, named after its offset.
func chargeOffsets(p pgdedup.TopicPartition) func(context.Context, pgx.Tx, []int64) error {
	return func(ctx context.Context, tx pgx.Tx, fresh []int64) error {
		for _, o := range fresh {
			if err := charge(fmt.Sprintf("%s/%d/%d", p.Topic, p.Partition, o))(ctx, tx); err != nil {
				return err
			}
		}
		return nil
	}
}

// storedOffset returns the stored last offset of p for billing, or -1.
func storedOffset(t *testing.T, pool *pgxpool.Pool, p pgdedup.TopicPartition) int64 {
	t.Helper()
	var last int64 = -1
	err := pool.QueryRow(context.Background(),
		`SELECT last_offset FROM processed_offsets WHERE consumer = 'billing' AND topic = $1 AND partition = $2`, p.Topic, p.Partition).Scan(&last)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return last
}

func TestClaimOffsetsInCallerTx(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		fresh, err := b.store.ClaimOffsets(ctx, tx, orders, []int64{0, 1, 2})
		if err != nil || len(fresh) != 3 {
			return fmt.Errorf("first claim: %v, %v; want all 3", fresh, err)
		}
		for _, c := range []struct {
			offset int64
			want   bool
		}{{2, false}, {1, false}, {3, true}, {3, false}} {
			claimed, err := b.store.ClaimOffset(ctx, tx, orders, c.offset)
			if err != nil || claimed != c.want {
				return fmt.Errorf("ClaimOffset(%d) = %v, %v; want %v", c.offset, claimed, err, c.want)
			}
		}
		return chargeOffsets(orders)(ctx, tx, []int64{0, 1, 2, 3}) // the transaction is not aborted
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := storedOffset(t, b.pool, orders); got != 3 {
		t.Fatalf("stored offset %d, want 3", got)
	}

	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if claimed, err := b.store.ClaimOffset(ctx, tx, orders, 9); err != nil || !claimed {
		t.Fatal(claimed, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := storedOffset(t, b.pool, orders); got != 3 {
		t.Fatalf("stored offset %d after a rolled-back claim of 9, want 3", got)
	}
}

func TestProcessOffsetsSkipsAtOrBelowStored(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	fresh, err := b.store.ProcessOffsets(ctx, orders, []int64{0, 1, 2, 3, 4}, chargeOffsets(orders))
	if err != nil || len(fresh) != 5 {
		t.Fatalf("first batch: %v, %v; want 0-4", fresh, err)
	}
	var got []int64
	fresh, err = b.store.ProcessOffsets(ctx, orders, []int64{3, 4, 5, 6}, func(ctx context.Context, tx pgx.Tx, fresh []int64) error {
		got = fresh
		return chargeOffsets(orders)(ctx, tx, fresh)
	})
	if err != nil || fmt.Sprint(fresh) != "[5 6]" || fmt.Sprint(got) != "[5 6]" {
		t.Fatalf("overlapping batch: returned %v, fn got %v, err %v; want [5 6] both", fresh, got, err)
	}
	calls := 0
	processed, err := b.store.ProcessOffset(ctx, orders, 6, func(context.Context, pgx.Tx) error { calls++; return nil })
	if err != nil || processed || calls != 0 {
		t.Fatalf("redelivered offset 6: processed=%v err=%v calls=%d; want false, nil, 0", processed, err, calls)
	}
	perOrder := chargesPerOrder(t, b.pool)
	for o := range 7 {
		if n := perOrder[fmt.Sprintf("orders/3/%d", o)]; n != 1 {
			t.Errorf("offset %d charged %d times, want 1", o, n)
		}
	}
	if len(perOrder) != 7 {
		t.Errorf("%d offsets charged, want 7", len(perOrder))
	}
	if got := storedOffset(t, b.pool, orders); got != 6 {
		t.Fatalf("stored offset %d, want 6", got)
	}
}

// Kafka offsets have gaps (compaction, transaction markers), so a claim may
// jump ahead; what is behind the stored offset is then skipped, processed or
// not. That is why the consumer must not skip a record it fetched.
func TestProcessOffsetsAllowsGaps(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	fresh, err := b.store.ProcessOffsets(ctx, orders, []int64{0, 5, 9}, chargeOffsets(orders))
	if err != nil || fmt.Sprint(fresh) != "[0 5 9]" {
		t.Fatalf("batch with gaps: %v, %v; want [0 5 9]", fresh, err)
	}
	if ok, err := b.store.ProcessOffset(ctx, orders, 12, func(context.Context, pgx.Tx) error { return nil }); err != nil || !ok {
		t.Fatalf("offset 12 after 9: %v, %v; want processed", ok, err)
	}
	if ok, err := b.store.ProcessOffset(ctx, orders, 7, func(context.Context, pgx.Tx) error { return nil }); err != nil || ok {
		t.Fatalf("offset 7 behind the stored 12: %v, %v; want skipped", ok, err)
	}
}

func TestProcessOffsetsErrorAdvancesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	boom := errors.New("payment service down")
	_, err := b.store.ProcessOffsets(ctx, orders, []int64{0, 1}, func(ctx context.Context, tx pgx.Tx, fresh []int64) error {
		if err := chargeOffsets(orders)(ctx, tx, fresh); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the handler's", err)
	}
	if got, n := storedOffset(t, b.pool, orders), pgtest.Count(t, b.pool, `SELECT count(*) FROM charges`); got != -1 || n != 0 {
		t.Fatalf("after a failed handler: stored offset %d, %d charges; want none", got, n)
	}
	if fresh, err := b.store.ProcessOffsets(ctx, orders, []int64{0, 1}, chargeOffsets(orders)); err != nil || len(fresh) != 2 {
		t.Fatalf("retry: %v, %v; want both processed", fresh, err)
	}
}

// TestOffsetsConsumersFightingOverAPartition runs consumers that all read the
// same partition from where the database says, in batches of random sizes, the
// way an owner and zombies of a revoked partition would, plus one replaying
// from offset 0. Every offset must be charged exactly once.
func TestOffsetsConsumersFightingOverAPartition(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	const records = 600
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	processedBy := make([]int, 4)
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(c)))
			next := int64(0)
			if c > 0 { // c == 0 replays from the start, like a rewound zombie
				got, err := b.store.ResumeOffsets(ctx, map[string][]int32{orders.Topic: {orders.Partition}})
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				if o, ok := got[orders.Topic][orders.Partition]; ok {
					next = o
				}
			}
			for next < records {
				n := min(int64(1+rng.IntN(20)), records-next)
				batch := make([]int64, n)
				for i := range batch {
					batch[i] = next + int64(i)
				}
				fresh, err := b.store.ProcessOffsets(ctx, orders, batch, chargeOffsets(orders))
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				processedBy[c] += len(fresh)
				next += n
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	perOrder := chargesPerOrder(t, b.pool)
	for o := range records {
		if n := perOrder[fmt.Sprintf("orders/3/%d", o)]; n != 1 {
			t.Errorf("offset %d charged %d times, want 1", o, n)
		}
	}
	t.Logf("records processed by each consumer: %v", processedBy)
	if got := storedOffset(t, b.pool, orders); got != records-1 {
		t.Fatalf("stored offset %d, want %d", got, records-1)
	}
}

// A claim waiting for another transaction on the same partition skips what
// that transaction committed and proceeds when it rolled back.
func TestClaimOffsetsWaitsForTheHolder(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	for _, commit := range []bool{true, false} {
		p := pgdedup.TopicPartition{Topic: "orders", Partition: map[bool]int32{true: 1, false: 2}[commit]}
		holder, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if fresh, err := b.store.ClaimOffsets(ctx, holder, p, []int64{0, 1, 2}); err != nil || len(fresh) != 3 {
			t.Fatal(fresh, err)
		}
		done := make(chan []int64)
		go func() {
			fresh, err := b.store.ProcessOffsets(ctx, p, []int64{1, 2, 3}, chargeOffsets(p))
			if err != nil {
				t.Error(err)
			}
			done <- fresh
		}()
		select {
		case fresh := <-done:
			t.Fatalf("second claim returned %v while the first transaction held the partition", fresh)
		case <-time.After(200 * time.Millisecond):
		}
		want := "[1 2 3]"
		if commit {
			want = "[3]"
			err = holder.Commit(ctx)
		} else {
			err = holder.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		if fresh := <-done; fmt.Sprint(fresh) != want {
			t.Errorf("first transaction commit=%v: second got %v, want %s", commit, fresh, want)
		}
	}
}

func TestClaimOffsetsLockTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{LockTimeout: 50 * time.Millisecond})
	ctx := ctxT(t)
	holder, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck
	if _, err := b.store.ClaimOffset(ctx, holder, orders, 0); err != nil {
		t.Fatal(err)
	}
	_, err = b.store.ProcessOffset(ctx, orders, 1, func(context.Context, pgx.Tx) error { return nil })
	if !errors.Is(err, pgdedup.ErrInFlight) {
		t.Fatalf("err = %v, want ErrInFlight", err)
	}
}

func TestOffsetsFenceOlderGeneration(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	zombie := pgdedup.TopicPartition{Topic: "orders", Partition: 0, Generation: 4}
	owner := zombie
	owner.Generation = 5
	if _, err := b.store.ProcessOffsets(ctx, zombie, []int64{0, 1, 2}, chargeOffsets(zombie)); err != nil {
		t.Fatal(err)
	}
	if fresh, err := b.store.ProcessOffsets(ctx, owner, []int64{3}, chargeOffsets(owner)); err != nil || len(fresh) != 1 {
		t.Fatal(fresh, err)
	}
	calls := 0
	_, err := b.store.ProcessOffsets(ctx, zombie, []int64{4, 5}, func(context.Context, pgx.Tx, []int64) error { calls++; return nil })
	if !errors.Is(err, pgdedup.ErrFenced) || calls != 0 {
		t.Fatalf("zombie of generation 4 after 5 committed: err=%v calls=%d; want ErrFenced, 0", err, calls)
	}
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := b.store.ClaimOffset(ctx, tx, zombie, 1) // below the stored offset: fenced all the same
		return err
	})
	if !errors.Is(err, pgdedup.ErrFenced) {
		t.Fatalf("ClaimOffset by the zombie: %v, want ErrFenced", err)
	}
	if fresh, err := b.store.ProcessOffsets(ctx, owner, []int64{4, 5}, chargeOffsets(owner)); err != nil || len(fresh) != 2 {
		t.Fatalf("owner after the zombie was fenced: %v, %v", fresh, err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM charges`); n != 6 {
		t.Fatalf("%d charges, want 6 (offsets 0-5 once each)", n)
	}
	var gen int64
	if err := b.pool.QueryRow(ctx, `SELECT generation FROM processed_offsets`).Scan(&gen); err != nil || gen != 5 {
		t.Fatalf("stored generation %d, %v; want 5", gen, err)
	}
}

func TestResumeOffsets(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	payments, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "payments"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		s      *pgdedup.Store
		p      pgdedup.TopicPartition
		offset int64
	}{
		{b.store, pgdedup.TopicPartition{Topic: "orders", Partition: 0}, 41},
		{b.store, pgdedup.TopicPartition{Topic: "orders", Partition: 2}, 0},
		{b.store, pgdedup.TopicPartition{Topic: "refunds", Partition: 0}, 7},
		{payments, pgdedup.TopicPartition{Topic: "orders", Partition: 1}, 99},
	} {
		if _, err := c.s.ProcessOffset(ctx, c.p, c.offset, func(context.Context, pgx.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	got, err := b.store.ResumeOffsets(ctx, map[string][]int32{"orders": {0, 1, 2, 3}, "refunds": {0}, "other": {0}})
	if err != nil {
		t.Fatal(err)
	}
	if s := fmt.Sprint(got); s != "map[orders:map[0:42 2:1] refunds:map[0:8]]" {
		t.Fatalf("ResumeOffsets = %s; want orders 0→42, 2→1, refunds 0→8 and nothing else", s)
	}
	if got, err := b.store.ResumeOffsets(ctx, nil); err != nil || len(got) != 0 {
		t.Fatalf("ResumeOffsets(nil) = %v, %v", got, err)
	}
}

func TestOffsetsRejectBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	nop := func(context.Context, pgx.Tx, []int64) error { return nil }
	for _, c := range []struct {
		p       pgdedup.TopicPartition
		offsets []int64
		says    string
	}{
		{pgdedup.TopicPartition{}, []int64{1}, "topic empty"},
		{pgdedup.TopicPartition{Topic: "a\x00b"}, []int64{1}, "NUL"},
		{pgdedup.TopicPartition{Topic: "\xff"}, []int64{1}, "UTF-8"},
		{pgdedup.TopicPartition{Topic: strings.Repeat("t", 1025)}, []int64{1}, "longer than 1024"},
		{pgdedup.TopicPartition{Topic: "t", Partition: -1}, []int64{1}, "partition -1"},
		{pgdedup.TopicPartition{Topic: "t", Generation: -2}, []int64{1}, "generation -2"},
		{orders, []int64{-1}, "negative"},
		{orders, []int64{1, 2, 2}, "offset 2 of 3 (2) is not above"},
		{orders, []int64{5, 3}, "offset 1 of 2 (3)"},
	} {
		_, err := b.store.ProcessOffsets(ctx, c.p, c.offsets, nop)
		if !errors.Is(err, pgdedup.ErrInvalidOffset) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("ProcessOffsets(%+v, %v) = %v; want ErrInvalidOffset saying %q", c.p, c.offsets, err, c.says)
		}
	}
	if _, err := b.store.ResumeOffsets(ctx, map[string][]int32{"": {0}}); !errors.Is(err, pgdedup.ErrInvalidOffset) {
		t.Errorf("ResumeOffsets with an empty topic: %v", err)
	}
	if _, err := b.store.ProcessOffset(ctx, orders, 1, nil); err == nil {
		t.Error("ProcessOffset with a nil fn: no error")
	}
	if fresh, err := b.store.ProcessOffsets(ctx, orders, nil, nop); err != nil || fresh != nil {
		t.Errorf("empty batch: %v, %v", fresh, err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_offsets`); n != 0 {
		t.Fatalf("%d rows written by rejected calls", n)
	}
}

// Config.OffsetTable defaults to processed_offsets in Config.Table's schema.
func TestOffsetTableFollowsTableSchema(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := ctxT(t)
	mustExec(t, db.Pool, `CREATE SCHEMA `+db.Schema+`_ops`)
	t.Cleanup(func() { mustExec(t, db.Pool, `DROP SCHEMA `+db.Schema+`_ops CASCADE`) })
	mustExec(t, db.Pool, `CREATE TABLE `+db.Schema+`_ops.processed_offsets (LIKE processed_offsets INCLUDING ALL)`)
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing", Table: db.Schema + "_ops.processed_messages"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.ProcessOffset(ctx, orders, 1, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM `+db.Schema+`_ops.processed_offsets`); n != 1 {
		t.Fatalf("%d rows in the schema-qualified offset table, want 1", n)
	}
	if _, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing", OffsetTable: "a.b.c"}); err == nil || !strings.Contains(err.Error(), "Config.OffsetTable") {
		t.Fatalf("New with a bad OffsetTable: %v", err)
	}
}

// BEGIN, the claim and the read of the stored row travel together: a batch of
// new records costs what the bare transaction costs, a redelivered batch 2
// round trips, a claim in the caller's transaction 1.
func TestOffsetsRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	store, pool, measure := countedStore(t, b)
	ctx := ctxT(t)
	next := int64(0)
	batch := func() error {
		_, err := store.ProcessOffsets(ctx, orders, []int64{next, next + 1, next + 2}, func(ctx context.Context, tx pgx.Tx, _ []int64) error {
			return charge("o")(ctx, tx)
		})
		next += 3
		return err
	}
	redelivered := func() error {
		_, err := store.ProcessOffsets(ctx, orders, []int64{0, 1, 2}, chargeOffsets(orders))
		return err
	}
	for range 2 { // warm up: prepare statements on the single connection
		_, _ = batch(), redelivered()
	}
	if got := measure(batch); got != 3 {
		t.Errorf("ProcessOffsets of 3 new records with one insert: %d round trips, want 3 (BEGIN+claim, insert, COMMIT)", got)
	}
	if got := measure(redelivered); got != 2 {
		t.Errorf("ProcessOffsets of a redelivered batch: %d round trips, want 2", got)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	_, _ = store.ClaimOffsets(ctx, tx, orders, []int64{100})
	if got := measure(func() error { _, err := store.ClaimOffsets(ctx, tx, orders, []int64{101, 102, 103}); return err }); got != 1 {
		t.Errorf("ClaimOffsets: %d round trips, want 1", got)
	}
}

// The connection is cut right after COMMIT is sent: whether it landed or not,
// the retry leaves every record charged once.
func TestProcessOffsetsRetriesAmbiguousCommit(t *testing.T) {
	t.Parallel()
	for _, how := range []wireproxy.Cut{wireproxy.CutAfterCommit, wireproxy.CutBeforeCommit} {
		t.Run(fmt.Sprintf("cut=%d", how), func(t *testing.T) {
			t.Parallel()
			b := setup(t, pgdedup.Config{})
			proxy, proxied := pgtest.NewProxy(t, b.db.URL, wireproxy.Config{})
			store, err := pgdedup.New(pgtest.Pool(t, proxied, 2), pgdedup.Config{Consumer: "billing", MaxAttempts: 10}) // the cuts hit consecutive commits
			if err != nil {
				t.Fatal(err)
			}
			ctx := ctxT(t)
			const batches, cuts = 30, 8
			proxy.CutCommits(cuts, how)
			for i := range int64(batches) {
				if _, err := store.ProcessOffsets(ctx, orders, []int64{2 * i, 2*i + 1}, chargeOffsets(orders)); err != nil {
					t.Fatalf("batch %d: %v", i, err)
				}
			}
			if st := proxy.Stats(); st.CutBefore+st.CutAfter != cuts {
				t.Fatalf("%+v: want %d commits cut", st, cuts)
			}
			got := chargesPerOrder(t, b.pool)
			for o := range 2 * batches {
				if n := got[fmt.Sprintf("orders/3/%d", o)]; n != 1 {
					t.Errorf("offset %d charged %d times, want 1", o, n)
				}
			}
		})
	}
}

// The runtime role needs SELECT, INSERT and UPDATE on processed_offsets, and
// nothing else of pgdedup's, to process, claim and resume offsets.
func TestOffsetsLeastPrivilege(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	pool, _ := rolePool(t, b, `GRANT USAGE ON SCHEMA `+b.db.Schema+` TO %s`,
		`GRANT SELECT, INSERT, UPDATE ON processed_offsets TO %s`)
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if fresh, err := store.ProcessOffsets(ctx, orders, []int64{0, 1}, chargeOffsets(orders)); err != nil || len(fresh) != 2 {
		t.Fatalf("ProcessOffsets: %v, %v", fresh, err)
	}
	if ok, err := store.ProcessOffset(ctx, orders, 1, func(context.Context, pgx.Tx) error { return nil }); err != nil || ok {
		t.Fatalf("ProcessOffset of a duplicate: %v, %v", ok, err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := store.ClaimOffset(ctx, tx, orders, 2)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := store.ResumeOffsets(ctx, map[string][]int32{"orders": {3}}); err != nil || got["orders"][3] != 3 {
		t.Fatalf("ResumeOffsets: %v, %v", got, err)
	}
}
