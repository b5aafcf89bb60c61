package citus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
	"github.com/pgdedup/pgdedup/internal/wireproxy"
)

// 16 consumers, every message delivered twice: each is charged exactly once.
// Half the consumers use Process (claim and charge on one shard), half
// ProcessBatch of 8 (a multi-shard transaction: Citus commits it with 2PC).
func TestExactlyOnceUnderConcurrency(t *testing.T) {
	t.Parallel()
	s := newSchema(t, 0)
	store := s.store(t, pgdedup.Config{})
	ctx := ctxT(t, 3*time.Minute)
	b := &broker{}
	b.publish(1_000)
	err := b.run(ctx, 16, func(c int) int { return 1 + c%2*7 }, nil, func(ctx context.Context, c int, ids []string) error {
		if len(ids) == 1 && c%2 == 0 {
			_, err := store.Process(ctx, ids[0], charge(ids[0]))
			return err
		}
		_, err := store.ProcessBatch(ctx, ids, chargeBatch)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	s.checkExactlyOnce(t, b.published())
	if f := b.failures.Load(); f > 0 {
		t.Logf("%d deliveries failed and were delivered again; last: %v", f, b.lastErr.Load())
	}
}

var errRolledBack = errors.New("rolled back on purpose")

// chargeBatch charges each fresh message once, in one multi-row insert.
func chargeBatch(ctx context.Context, tx pgx.Tx, fresh []string) error {
	rows := make([][]any, len(fresh))
	for i, id := range fresh {
		rows[i] = []any{id, "billing", int64(100)}
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"charges"}, []string{"message_id", "consumer", "amount"}, pgx.CopyFromRows(rows))
	return err
}

// The connection is cut around COMMIT: before it (the transaction rolls back)
// and after it (it committed, the client cannot tell). Process retries on a
// new connection; each message is charged exactly once either way.
func TestAmbiguousCommit(t *testing.T) {
	t.Parallel()
	s := newSchema(t, 0)
	proxy, proxied := pgtest.NewProxy(t, s.url, wireproxy.Config{})
	pool := pgtest.Pool(t, proxied, 4)
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", MaxAttempts: 5})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, time.Minute)
	var ids []string
	for i, how := range []wireproxy.Cut{wireproxy.CutAfterCommit, wireproxy.CutBeforeCommit, wireproxy.CutAfterCommit} {
		id := fmt.Sprint("ambiguous-", i)
		ids = append(ids, id)
		proxy.CutCommits(1, how)
		processed, err := store.Process(ctx, id, charge(id))
		if err != nil {
			t.Fatalf("Process(%s) with the COMMIT cut (%v): %v", id, how, err)
		}
		// After CutAfterCommit the retry finds the claim: a duplicate.
		if want := how == wireproxy.CutBeforeCommit; processed != want {
			t.Errorf("Process(%s) = %v after cut %v, want %v", id, processed, how, want)
		}
	}
	if st := proxy.Stats(); st.CutBefore != 1 || st.CutAfter != 2 {
		t.Fatalf("proxy cut %d COMMITs before and %d after, want 1 and 2", st.CutBefore, st.CutAfter)
	}
	s.checkExactlyOnce(t, ids)
}

// Config.LockTimeout bounds the wait on the worker that holds the shard: a
// duplicate of a message in flight gives ErrInFlight within twice the timeout,
// from Process, ProcessBatch, Claim and ClaimSQL alike. And the caller's own
// settings come back: lock_timeout on the coordinator, and on the workers,
// where a later lock wait in the same transaction is not cut short.
func TestLockTimeoutOnTheWorkers(t *testing.T) {
	t.Parallel()
	s := newSchema(t, 0)
	const timeout = 300 * time.Millisecond
	store := s.store(t, pgdedup.Config{LockTimeout: timeout})
	ctx := ctxT(t, time.Minute)
	pgtest.HoldClaim(t, s.pool, store, "held")

	within := func(name string, f func() error) {
		t.Helper()
		start := time.Now()
		err := f()
		if took := time.Since(start); !errors.Is(err, pgdedup.ErrInFlight) || took > 2*timeout {
			t.Errorf("%s of a message in flight: %v after %s; want ErrInFlight within %s", name, err, took, 2*timeout)
		}
	}
	within("Process", func() error { _, err := store.Process(ctx, "held", charge("held")); return err })
	within("ProcessBatch", func() error { _, err := store.ProcessBatch(ctx, []string{"a", "held", "z"}, chargeBatch); return err })
	within("Claim", func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { _, err := store.Claim(ctx, tx, "held"); return err })
	})

	// A claim that succeeds leaves the caller's settings as they were.
	blocker, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `INSERT INTO charges (message_id, consumer, amount) VALUES ('busy', 'billing', 1)`); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '7s'`); err != nil {
			return err
		}
		if ok, err := store.Claim(ctx, tx, "busy"); err != nil || !ok {
			return fmt.Errorf("Claim(busy) = %v, %v", ok, err)
		}
		if fresh, err := store.ClaimBatch(ctx, tx, []string{"busy-2", "busy-3"}); err != nil || len(fresh) != 2 {
			return fmt.Errorf("ClaimBatch = %v, %v", fresh, err)
		}
		var lt, prop, mode string
		if err := tx.QueryRow(ctx, `SELECT current_setting('lock_timeout'), current_setting('citus.propagate_set_commands'),
current_setting('citus.multi_shard_modify_mode')`).Scan(&lt, &prop, &mode); err != nil {
			return err
		}
		if lt != "7s" || prop != "none" || mode != "parallel" {
			t.Errorf("after the claims the coordinator has lock_timeout %s, propagate_set_commands %s, multi_shard_modify_mode %s; want 7s, none, parallel", lt, prop, mode)
		}
		// The worker holding 'busy' waits for the blocker as the caller's
		// settings say (its own lock_timeout, 0), not 300ms: the blocker
		// commits after a second, then the insert fails on the primary key.
		committed := make(chan error, 1)
		go func() { time.Sleep(time.Second); committed <- blocker.Commit(context.Background()) }()
		start := time.Now()
		_, err := tx.Exec(ctx, `INSERT INTO charges (message_id, consumer, amount) VALUES ('busy', 'billing', 1)`)
		if cerr := <-committed; cerr != nil {
			return cerr
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23505" || time.Since(start) < 900*time.Millisecond {
			t.Errorf("insert waiting on the blocker: %v after %s; want a unique violation after about 1s", err, time.Since(start))
		}
		return errRolledBack
	})
	if !errors.Is(err, errRolledBack) {
		t.Fatal(err)
	}
}

// Four cleaners at once on 60,000 expired rows among live ones, while a
// consumer processes messages: every expired row goes, exactly once in all,
// no live row goes, and no batch exceeds CleanupBatchSize.
func TestConcurrentCleaners(t *testing.T) {
	t.Parallel()
	s := newSchema(t, 0)
	ctx := ctxT(t, 2*time.Minute)
	pgtest.Seed(t, s.pool, "billing", "old-", 40_000, -time.Hour)
	pgtest.Seed(t, s.pool, "emails", "old-", 20_000, -2*time.Hour)
	pgtest.Seed(t, s.pool, "billing", "live-", 1_000, time.Hour)
	logs := &pgtest.LogCapture{}
	const size = 3_000
	cleaners := make([]*pgdedup.Store, 4)
	for i := range cleaners {
		cleaners[i] = s.store(t, pgdedup.Config{CleanupBatchSize: size, Logger: slog.New(logs)})
	}
	consumer := s.store(t, pgdedup.Config{})
	deleted := make([]int64, len(cleaners))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			default:
			}
			id := fmt.Sprint("new-", i)
			if _, err := consumer.Process(ctx, id, charge(id)); err != nil {
				t.Errorf("Process during cleanup: %v", err)
				return
			}
			if i >= 200 {
				return
			}
		}
	}()
	pgtest.FanOut(t, len(cleaners), func(i int) error {
		for { // like RunCleaner: again and again until nothing is left
			n, err := cleaners[i].Cleanup(ctx)
			deleted[i] += n
			if err != nil || pgtest.Count(t, s.pool, `SELECT count(*) FROM processed_messages WHERE expires_at < now()`) == 0 {
				return err
			}
			time.Sleep(time.Duration(i) * time.Millisecond)
		}
	})
	<-done
	var total int64
	for _, n := range deleted {
		total += n
	}
	if total != 60_000 {
		t.Errorf("cleaners deleted %v, %d in all; want 60000", deleted, total)
	}
	if n := pgtest.Count(t, s.pool, `SELECT count(*) FROM processed_messages WHERE message_id LIKE 'live-%' OR message_id LIKE 'new-%'`); n != 1_201 {
		t.Errorf("%d live rows left, want 1201", n)
	}
	for _, r := range logs.Records("pgdedup: cleanup batch") {
		if v, _ := pgtest.Attr(r, "deleted"); v.Int64() > size || v.Int64() < 1 {
			t.Errorf("a batch deleted %d rows, want 1 to %d", v.Int64(), size)
		}
	}
}

// Store.Stats sizes the shards, not the coordinator's empty shell.
func TestStatsCountShards(t *testing.T) {
	t.Parallel()
	s := newSchema(t, 0)
	pgtest.Seed(t, s.pool, "billing", "m-", 20_000, time.Hour)
	st, err := s.store(t, pgdedup.Config{}).Stats(ctxT(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var shell int64
	if err := s.pool.QueryRow(context.Background(), `SELECT pg_total_relation_size('processed_messages')`).Scan(&shell); err != nil {
		t.Fatal(err)
	}
	if st.Rows != 20_000 || st.TableBytes < 1<<20 || st.IndexBytes < 1<<20 || st.TotalBytes != st.TableBytes+st.IndexBytes || st.TotalBytes < 10*shell {
		t.Errorf("Stats = %d rows, table %d, indexes %d, total %d bytes (coordinator's shell: %d); want 20000 rows and the shards' MBs",
			st.Rows, st.TableBytes, st.IndexBytes, st.TotalBytes, shell)
	}
}

// Overlapping ClaimBatch calls from concurrent transactions never deadlock:
// they insert shard by shard in shard order, each shard's rows sorted.
func TestOverlappingBatchesDoNotDeadlock(t *testing.T) {
	t.Parallel()
	s := newSchema(t, 0)
	store := s.store(t, pgdedup.Config{})
	ctx := ctxT(t, 2*time.Minute)
	ids := make([]string, 400)
	for i := range ids {
		ids[i] = fmt.Sprintf("o-%04d", i)
	}
	claimed := make([][]string, 8)
	pgtest.FanOut(t, 8, func(i int) error {
		mine := slices.Clone(ids)
		slices.Reverse(mine[:i*40]) // differently ordered, overlapping batches
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			fresh, err := store.ClaimBatch(ctx, tx, mine)
			claimed[i] = fresh
			time.Sleep(50 * time.Millisecond) // hold the rows a while
			return err
		})
	})
	var all []string
	for _, c := range claimed {
		all = append(all, c...)
	}
	slices.Sort(all)
	if !slices.Equal(all, ids) {
		t.Fatalf("the batches claimed %d IDs in all, want each of the %d once", len(all), len(ids))
	}
}
