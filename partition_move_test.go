package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// Moving a populated plain table to the partitioned layout with Setup
// (partition_move.go), with short spans: the switch time T is a few seconds
// after the move.

// legacyPartition is the name the move gives the old table.
const legacyPartition = "processed_messages_p20000101t000000"

// moveStore is a Store on b's table whose move lead and layout re-check are
// lead and recheck (negative: never, as a release before the move).
func moveStore(t *testing.T, b *bundle, cfg pgdedup.Config, lead, recheck time.Duration) *pgdedup.Store {
	t.Helper()
	cfg.Consumer = cmpOr(cfg.Consumer, "billing")
	s, err := pgdedup.New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	pgdedup.SetMoveTimes(s, lead, recheck)
	return s
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// switchTime returns T, where the legacy partition ends, from
// pgdedup_partitions (sealed starts at T - span).
func switchTime(t *testing.T, b *bundle) time.Time {
	t.Helper()
	var at time.Time
	if err := b.pool.QueryRow(context.Background(), `SELECT sealed + span FROM pgdedup_partitions
WHERE parent = 'processed_messages'::regclass`).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

// populate claims n IDs pre-0… on the plain table, each charged once.
func populate(t *testing.T, b *bundle, s *pgdedup.Store, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("pre-%d", i)
	}
	_, err := s.ProcessBatch(ctxT(t), ids, func(ctx context.Context, tx pgx.Tx, fresh []string) error {
		for _, id := range fresh {
			if err := charge("billing/"+id)(ctx, tx); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// refusedOnCitus checks, in the Citus pass, that Setup refuses to move the
// distributed table once it holds an ID (the move runs on plain PostgreSQL
// only), and reports whether the test has nothing more to run.
func refusedOnCitus(t *testing.T, b *bundle, s *pgdedup.Store) bool {
	t.Helper()
	if pgtest.CitusColumn() == "" {
		return false
	}
	pgtest.Seed(t, b.pool, "billing", "citus", 1, time.Hour)
	if err := s.Setup(ctxT(t)); err == nil || !strings.Contains(err.Error(), "plain PostgreSQL only") {
		t.Fatalf("Setup of a distributed table: %v, want a refusal (plain PostgreSQL only)", err)
	}
	return true
}

// A populated plain table moves while claims of three kinds go on: a Store
// that never looks the table up again (a release before the move, which
// claims with the plain statement; it stops before T, as the procedure
// says), a Plain-configured Store that looks it up again every 20 ms, and,
// once Setup returned, a Partitioned one. Every message is delivered three
// times at about the same time, by random kinds, by Process or
// ProcessBatch. The clock then crosses T, a cleaner (Retention 8 s, 2 s
// spans) seals, and drops the legacy partition once its rows expired. 0
// doubled, 0 lost, and the IDs claimed before the move stay duplicates
// after it and after T. The longest claim that overlapped the move, and the
// longest lock wait of a claim seen on the server, are logged, not asserted.
func TestMoveUnderLoad(t *testing.T) {
	t.Parallel()
	const retention = 8 * time.Second
	b := setup(t, pgdedup.Config{Retention: retention})
	ctx := ctxT(t)
	old := moveStore(t, b, pgdedup.Config{Retention: retention}, 0, -1)
	plain := moveStore(t, b, pgdedup.Config{Retention: retention}, 0, 20*time.Millisecond)
	part := moveStore(t, b, pgdedup.Config{Retention: retention, Layout: pgdedup.LayoutPartitioned, Partitions: 4}, 4*time.Second, 20*time.Millisecond)
	if refusedOnCitus(t, b, part) {
		return
	}
	cleaner := moveStore(t, b, pgdedup.Config{Consumer: "keeper", Retention: retention}, 0, 20*time.Millisecond)
	pgdedup.SetPartitionWaits(cleaner, time.Second, time.Millisecond)
	pre := populate(t, b, plain, 300)
	preUntil := time.Now().Add(retention - 2*time.Second) // redelivered while recorded

	cctx, stopCleaner := context.WithCancel(ctx)
	var cleanerDone sync.WaitGroup
	cleanerDone.Go(func() {
		for cctx.Err() == nil {
			_, _ = cleaner.Cleanup(cctx)
			select {
			case <-cctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	defer func() { stopCleaner(); cleanerDone.Wait() }()

	// phase 0: before Setup returned (old, plain); 1: after (all three);
	// 2: from shortly before T (plain, part).
	var phase atomic.Int32
	var oldInFlight atomic.Int32 // claims of the old Store under way
	pick := func() *pgdedup.Store {
		switch phase.Load() {
		case 0:
			return []*pgdedup.Store{old, plain}[rand.N(2)]
		case 1:
			return []*pgdedup.Store{old, plain, part}[rand.N(3)]
		}
		return []*pgdedup.Store{plain, part}[rand.N(2)]
	}
	var (
		mu         sync.Mutex
		delivered  = map[string]bool{}
		failures   = map[string]int{}
		moveFrom   time.Time // Setup's call and return
		moveTo     time.Time
		longest    time.Duration // the longest claim overlapping the move
		before     time.Duration // and ending before it
		claimsSeen int           // claims overlapping the move
	)
	deliver := func(id string) {
		for ctx.Err() == nil {
			oldInFlight.Add(1) // before pick: the drain below cannot miss it
			s := pick()
			if s != old {
				oldInFlight.Add(-1)
			}
			start := time.Now()
			var err error
			if rand.N(3) == 0 { // the batch statement
				_, err = s.ProcessBatch(ctx, []string{id}, func(ctx context.Context, tx pgx.Tx, fresh []string) error {
					if len(fresh) == 0 {
						return nil
					}
					return charge("billing/"+id)(ctx, tx)
				})
			} else {
				_, err = s.Process(ctx, id, charge("billing/"+id))
			}
			end := time.Now()
			if s == old {
				oldInFlight.Add(-1)
			}
			mu.Lock()
			switch {
			case moveFrom.IsZero():
				before = max(before, end.Sub(start))
			case end.After(moveFrom) && (moveTo.IsZero() || start.Before(moveTo)):
				longest = max(longest, end.Sub(start))
				claimsSeen++
			}
			if err != nil {
				msg := err.Error()
				failures[msg[:min(len(msg), 70)]]++
			}
			mu.Unlock()
			if err == nil {
				return
			}
		}
	}
	stopLoad := make(chan struct{})
	var load sync.WaitGroup
	load.Go(func() {
		for round := 0; ; round++ {
			select {
			case <-stopLoad:
				return
			default:
			}
			var ids []string
			// At most 17 at once: the pool's 20 connections, less the
			// cleaner's and Setup's, so that a claim's time is not a wait
			// for a connection.
			for i := range 5 {
				id := fmt.Sprintf("r%d-%d", round, i)
				mu.Lock()
				delivered[id] = true
				mu.Unlock()
				ids = append(ids, id, id, id)
			}
			if time.Now().Before(preUntil) {
				for range 2 {
					ids = append(ids, pre[rand.N(len(pre))])
				}
			}
			var wg sync.WaitGroup
			for _, id := range ids {
				wg.Go(func() { deliver(id) })
			}
			wg.Wait()
		}
	})

	time.Sleep(300 * time.Millisecond)
	// Claims waiting for a lock, as the server sees them, sampled every
	// 20 ms while the move runs: the longest such wait seen.
	var lockWait time.Duration
	sampled := make(chan struct{})
	stopSampling := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			var d time.Duration
			_ = b.pool.QueryRow(context.Background(), `SELECT coalesce(max(clock_timestamp() - query_start), '0') FROM pg_stat_activity
WHERE datname = current_database() AND state = 'active' AND wait_event_type = 'Lock' AND (query LIKE 'INSERT%' OR query LIKE 'WITH%')`).Scan(&d)
			lockWait = max(lockWait, d)
			select {
			case <-stopSampling:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	mu.Lock()
	moveFrom = time.Now()
	mu.Unlock()
	if err := part.Setup(ctx); err != nil {
		t.Fatalf("Setup of the populated table under load: %v", err)
	}
	mu.Lock()
	moveTo = time.Now()
	mu.Unlock()
	close(stopSampling)
	<-sampled
	phase.Store(1)
	at := switchTime(t, b)
	t.Logf("moved in %s; switch at %s, %s after the move", moveTo.Sub(moveFrom), at.Format("15:04:05.000"), time.Until(at))
	for _, s := range []*pgdedup.Store{part, plain} {
		if processed, err := s.Process(ctx, pre[0], charge("billing/"+pre[0])); err != nil || processed {
			t.Errorf("an ID claimed before the move, after it: processed=%v err=%v, want a duplicate", processed, err)
		}
	}
	// Releases before the move are gone before T: no new claim of the old
	// Store from 1.5 s before, and the last one ended before T.
	time.Sleep(time.Until(at.Add(-1500 * time.Millisecond)))
	phase.Store(2)
	for oldInFlight.Load() > 0 {
		time.Sleep(time.Millisecond)
	}
	if !time.Now().Before(at) {
		t.Fatalf("the machine is too slow for this test: a claim of the old Store was still under way at the switch (%s)", at)
	}
	for time.Now().Before(at.Add(100 * time.Millisecond)) {
		time.Sleep(10 * time.Millisecond)
	}
	for {
		var now time.Time
		if err := b.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
			t.Fatal(err)
		}
		if !now.Before(at) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if processed, err := part.Process(ctx, pre[1], charge("billing/"+pre[1])); err != nil || processed {
		t.Errorf("an ID claimed before the move, after the switch: processed=%v err=%v, want a duplicate", processed, err)
	}
	// The legacy partition goes once its rows expired (T + Retention). Its
	// DETACH … CONCURRENTLY waits for every older snapshot in the database,
	// and other tests of this package hold transactions open on purpose
	// (the starvation tests: up to tens of seconds under -parallel), so
	// the slack is a minute.
	deadline := time.Now().Add(time.Until(at) + retention + time.Minute)
	for pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_class WHERE oid = to_regclass('`+legacyPartition+`')`) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the legacy partition %s is still there %s after the switch", legacyPartition, time.Since(at))
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(stopLoad)
	load.Wait()

	charges := chargesPerOrder(t, b.pool)
	doubled, lost := 0, 0
	for _, id := range pre {
		delivered[id] = true
	}
	for id := range delivered {
		switch n := charges["billing/"+id]; {
		case n == 0:
			lost++
		case n > 1:
			doubled++
			t.Errorf("%s charged %d times", id, n)
		}
	}
	if lost > 0 || doubled > 0 || len(charges) != len(delivered) {
		t.Errorf("%d messages: %d doubled, %d lost, %d charged", len(delivered), doubled, lost, len(charges))
	}
	t.Logf("%d messages; %d claims overlapped the move: the longest took %s (the longest before it %s), the longest wait for a lock seen on the server %s; "+
		"failed deliveries (delivered again): %v", len(delivered), claimsSeen, longest, before, lockWait, failures)
}

// A row at or after T (here an ID imported with a time a day ahead, as any
// role with INSERT could) or before 2000 does not stop the move: Setup
// moves its processed_at to the move's time, and the table moves. The IDs
// stay duplicates.
func TestMoveRowsOutsideTheLegacyRange(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	part := moveStore(t, b, pgdedup.Config{Layout: pgdedup.LayoutPartitioned, Retention: 20 * time.Second, Partitions: 10}, time.Second, 0)
	if refusedOnCitus(t, b, part) {
		return
	}
	populate(t, b, b.store, 5)
	mustExec(t, b.pool, `INSERT INTO processed_messages (consumer, message_id, processed_at, expires_at) VALUES
('billing', 'ahead', now() + interval '1 day', now() + interval '2 days'),
('billing', 'far-ahead', 'infinity', 'infinity'),
('billing', 'ancient', '1990-01-01', now() + interval '1 day')`)
	ctx := ctxT(t)
	if err := part.Setup(ctx); err != nil {
		t.Fatalf("Setup with rows outside the legacy partition's range: %v", err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_class WHERE oid = 'processed_messages'::regclass AND relkind = 'p'`); n != 1 {
		t.Fatal("processed_messages is not partitioned after Setup")
	}
	for id, want := range map[string]bool{"ahead": false, "far-ahead": false, "ancient": false, "pre-0": false, "new": true} {
		if processed, err := part.Process(ctx, id, charge("billing/"+id)); err != nil || processed != want {
			t.Errorf("Process %s after the move: processed=%v err=%v, want %v", id, processed, err, want)
		}
	}
}

// assertStillPlain checks that a failed move left the plain table as it
// was: no check of the move left, the IDs claimed before still duplicates,
// new ones claimed.
func assertStillPlain(t *testing.T, b *bundle) {
	t.Helper()
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_constraint WHERE conrelid = 'processed_messages'::regclass AND conname LIKE 'pgdedup_move%'`); n != 0 {
		t.Errorf("%d checks of the move left on the table", n)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_class WHERE oid = 'processed_messages'::regclass AND relkind = 'r'`); n != 1 {
		t.Error("processed_messages is no longer a plain table")
	}
	ctx := ctxT(t)
	for id, want := range map[string]bool{"pre-0": false, "after-failed-move": true} {
		if processed, err := b.store.Process(ctx, id, charge("billing/"+id)); err != nil || processed != want {
			t.Errorf("Process %s: processed=%v err=%v, want %v", id, processed, err, want)
		}
	}
}

// While a transaction holds its claim open, the move cannot take its brief
// lock: Setup retries under a short lock_timeout until its deadline (half
// the lead before T), gives up, and leaves the table as it was. Once the
// transaction ends, Setup moves the table.
func TestMoveGivesUpWhileLocked(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	part := moveStore(t, b, pgdedup.Config{Layout: pgdedup.LayoutPartitioned, Retention: 20 * time.Second, Partitions: 10}, 2*time.Second, 0)
	if refusedOnCitus(t, b, part) {
		return
	}
	populate(t, b, b.store, 5)
	ctx := ctxT(t)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if claimed, err := b.store.Claim(ctx, tx, "held"); err != nil || !claimed {
		t.Fatalf("Claim: %v %v", claimed, err)
	}
	err = part.Setup(ctx)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" || !strings.Contains(err.Error(), "gave up") {
		t.Fatalf("Setup while a transaction holds the table: %v, want lock_not_available after retries", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	assertStillPlain(t, b)
	if err := part.Setup(ctx); err != nil {
		t.Fatalf("Setup once the transaction ended: %v", err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_class WHERE oid = 'processed_messages'::regclass AND relkind = 'p'`); n != 1 {
		t.Error("processed_messages is not partitioned after Setup")
	}
}

// Setup run again after a move changes nothing: the same partitions, the
// IDs still there.
func TestMoveTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	part := moveStore(t, b, pgdedup.Config{Layout: pgdedup.LayoutPartitioned, Retention: time.Hour, Partitions: 12}, 0, 0)
	if refusedOnCitus(t, b, part) {
		return
	}
	populate(t, b, b.store, 5)
	ctx := ctxT(t)
	if err := part.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	partitions := func() map[string]int {
		return pgtest.CountBy(t, b.pool, `SELECT c.relname::text, 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'processed_messages'::regclass`)
	}
	first := partitions()
	if first[legacyPartition] != 1 {
		t.Fatalf("partitions after the move: %v, want %s (and those from the switch on, if within three spans)", first, legacyPartition)
	}
	if err := part.Setup(ctx); err != nil {
		t.Fatalf("Setup again: %v", err)
	}
	if second := partitions(); fmt.Sprint(second) != fmt.Sprint(first) {
		t.Errorf("partitions after a second Setup: %v, want %v", second, first)
	}
	if processed, err := part.Process(ctx, "pre-3", charge("billing/pre-3")); err != nil || processed {
		t.Errorf("an ID claimed before the move: processed=%v err=%v, want a duplicate", processed, err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 5 {
		t.Errorf("%d rows after the move, want the 5 claimed before", n)
	}
}

// The move run by a goose host, as a Go migration of its own (a Provider
// here; goose.AddNamedMigrationNoTxContext takes the same function).
func TestMoveAsGooseMigration(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	populate(t, b, b.store, 5)
	db := openSQL(t, b)
	cfg := pgdedup.Config{Retention: time.Hour, Partitions: 12}
	p, err := goose.NewProvider(goose.DialectPostgres, db, nil,
		goose.WithTableName("host_goose_version"), goose.WithDisableGlobalRegistry(true),
		goose.WithGoMigrations(goose.NewGoMigration(42, &goose.GoFunc{RunDB: pgdedup.SetupMigration(cfg)}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Up(ctxT(t))
	if pgtest.CitusColumn() != "" {
		if err == nil || !strings.Contains(err.Error(), "plain PostgreSQL only") {
			t.Fatalf("the migration on a distributed table: %v, want a refusal", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits WHERE inhrelid = to_regclass('`+legacyPartition+`')`); n != 1 {
		t.Error("the table was not moved to the partitioned layout")
	}
	if processed, err := b.store.Process(ctxT(t), "pre-2", charge("billing/pre-2")); err != nil || processed {
		t.Errorf("an ID claimed before the migration: processed=%v err=%v, want a duplicate", processed, err)
	}
}

// The move keeps the table's grants: a runtime role with the README's
// grants claims on the moved table (which needs SELECT on
// pgdedup_partitions, granted with INSERT).
func TestMoveKeepsGrants(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	part := moveStore(t, b, pgdedup.Config{Layout: pgdedup.LayoutPartitioned, Retention: time.Hour}, 0, 0)
	if refusedOnCitus(t, b, part) {
		return
	}
	populate(t, b, b.store, 5)
	pool, _ := rolePool(t, b, runtimeGrants...)
	ctx := ctxT(t)
	if err := part.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", Layout: pgdedup.LayoutPartitioned, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{"pre-1": false, "new-1": true} {
		if processed, err := store.Process(ctx, id, charge("billing/"+id)); err != nil || processed != want {
			t.Errorf("Process %s as the runtime role: processed=%v err=%v, want %v", id, processed, err, want)
		}
	}
}

// A cleaner that still claims the table plain (a release before the move,
// or a Store within a minute of it) runs the plain cleanup on the moved
// table: its DELETE picks rows by ctid, which repeat across partitions, but
// checks expires_at again, so it deletes only expired rows, never a live row
// of another partition at the same ctid.
func TestPlainCleanupOnMovedTable(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	part := moveStore(t, b, pgdedup.Config{Layout: pgdedup.LayoutPartitioned, Retention: 20 * time.Second, Partitions: 10}, time.Second, 0)
	if refusedOnCitus(t, b, part) {
		return
	}
	pgtest.Seed(t, b.pool, "billing", "old", 20, -time.Minute) // expired, from ctid (0,1) on
	old := moveStore(t, b, pgdedup.Config{}, 0, -1)
	if _, _, err := old.Lookup(ctxT(t), "x"); err != nil { // finds the table plain
		t.Fatal(err)
	}
	if err := part.Setup(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// Live rows at ctid (0,1) … in the partition from the switch on.
	at := switchTime(t, b)
	mustExec(t, b.pool, `INSERT INTO processed_messages (consumer, message_id, processed_at, expires_at)
SELECT 'billing', 'live-' || g, $1::timestamptz, now() + interval '1 hour' FROM generate_series(1, 20) g`, at)
	deleted, err := old.Cleanup(ctxT(t))
	if err != nil || deleted != 20 {
		t.Errorf("the plain cleanup on the moved table: deleted %d, err %v; want the 20 expired rows", deleted, err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE message_id LIKE 'live-%'`); n != 20 {
		t.Errorf("%d of the 20 live rows left", n)
	}
}

// A Store configured Partitioned, rolled out before Setup ran (issue 27):
// on the plain table it claims with the plain statement, exactly once.
// Another such Store, which does not run Setup and looks the table up again
// only every minute, works beside it. After Setup moved the table, both
// still claim exactly once, and an ID claimed before Setup is still a
// duplicate.
func TestPartitionedStoreBeforeSetup(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	cfg := pgdedup.Config{Layout: pgdedup.LayoutPartitioned, Retention: time.Hour, Partitions: 12}
	part := moveStore(t, b, cfg, 0, 0)
	other := moveStore(t, b, cfg, 0, 0)
	ctx := ctxT(t)
	deliver := func(phase string) {
		t.Helper()
		for i := range 5 {
			id := fmt.Sprintf("%s-%d", phase, i)
			for d, s := range []*pgdedup.Store{part, other, part} {
				processed, err := s.Process(ctx, id, charge("billing/"+id))
				if err != nil || processed != (d == 0) {
					t.Fatalf("%s, delivery %d: processed=%v err=%v, want %v", id, d+1, processed, err, d == 0)
				}
			}
		}
		ids := []string{phase + "-b0", phase + "-b1", phase + "-0"}
		for d, s := range []*pgdedup.Store{other, part} {
			fresh, err := s.ProcessBatch(ctx, ids, func(ctx context.Context, tx pgx.Tx, fresh []string) error {
				for _, id := range fresh {
					if err := charge("billing/"+id)(ctx, tx); err != nil {
						return err
					}
				}
				return nil
			})
			if want := map[int]int{0: 2, 1: 0}[d]; err != nil || len(fresh) != want {
				t.Fatalf("%s batch delivery %d: fresh=%v err=%v, want %d fresh", phase, d+1, fresh, err, want)
			}
		}
	}
	deliver("before")
	if pgtest.CitusColumn() == "" {
		if err := part.Setup(ctx); err != nil {
			t.Fatal(err)
		}
		deliver("after")
		for _, s := range []*pgdedup.Store{part, other} {
			if processed, err := s.Process(ctx, "before-3", charge("billing/before-3")); err != nil || processed {
				t.Errorf("an ID claimed before Setup: processed=%v err=%v, want a duplicate", processed, err)
			}
		}
	}
	for order, n := range chargesPerOrder(t, b.pool) {
		if n != 1 {
			t.Errorf("order %s charged %d times, want once", order, n)
		}
	}
	if n := len(chargesPerOrder(t, b.pool)); n != 7 && n != 14 {
		t.Errorf("%d orders charged, want 7 per phase", n)
	}
}
