package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// The hand-over between partitions, forced step by step: 2-second
// partitions, switches waited for on the database's clock, claims held open
// in transactions of the test's, and Cleanup runs (which seal and drop) at
// chosen points. Nothing is asserted about time: the tests wait for states
// (the clock past a boundary, a session waiting on a lock) and then assert
// what was recorded.

// partitionClock returns where the current partition starts and where
// partitions are sealed before, by the database's clock.
func partitionClock(t *testing.T, pool *pgxpool.Pool) (current, sealed time.Time) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT date_bin(span, clock_timestamp(), '2000-01-01 00:00:00+00'), sealed
FROM pgdedup_partitions WHERE parent = 'processed_messages'::regclass`).Scan(&current, &sealed)
	if err != nil {
		t.Fatal(err)
	}
	return current, sealed
}

// waitSwitch waits until the database's clock is in a partition after the
// one it is in now, and returns where that one starts.
func waitSwitch(t *testing.T, pool *pgxpool.Pool) time.Time {
	t.Helper()
	from, _ := partitionClock(t, pool)
	for {
		now, _ := partitionClock(t, pool)
		if now.After(from) {
			return now
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// keepPartitions runs Cleanup on a Store of its own every 200ms until the
// test ends, so that partitions exist ahead of the 2-second clock. Its seal
// waits give up at once: only the test's own Cleanup calls wait. With the
// default Retention (48 h) it drops no partition.
func keepPartitions(t *testing.T, b *bundle) {
	keepPartitionsEvery(t, b, 200*time.Millisecond, time.Millisecond)
}

// keepPartitionsEvery runs Cleanup every interval, with seal waits of
// sealWait, until the test ends.
func keepPartitionsEvery(t *testing.T, b *bundle, interval, sealWait time.Duration) {
	t.Helper()
	store, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "keeper", Runway: fewestAhead})
	if err != nil {
		t.Fatal(err)
	}
	pgdedup.SetPartitionWaits(store, sealWait, time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			_, _ = store.Cleanup(ctx)
			select {
			case <-ctx.Done():
			case <-time.After(interval):
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// session is a connection of its own, told apart in pg_stat_activity by an
// application_name of its own (behind PgBouncer the client's backend pid is
// PgBouncer's, and the server session may change between transactions), for
// a claim the test holds open or watches wait.
type session struct {
	conn *pgx.Conn
	app  string
}

var sessionSeq atomic.Int64

func newSession(t *testing.T, b *bundle) *session {
	t.Helper()
	cfg, err := pgx.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	app := fmt.Sprintf("pgdedup-session-%d-%d", os.Getpid(), sessionSeq.Add(1))
	cfg.RuntimeParams["application_name"] = app
	conn, err := pgx.ConnectConfig(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return &session{conn: conn, app: app}
}

// waitLocked waits until s waits on a lock (another transaction's claim),
// failing after 30 s (a hang guard: it returns as soon as s waits).
func (s *session) waitLocked(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		q := `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
WHERE application_name = $1 AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())`
		if pgtest.CitusColumn() != "" { // the wait is on a worker, for the session's global PID
			q = `SELECT EXISTS (SELECT 1 FROM citus_lock_waits w JOIN citus_stat_activity a ON a.global_pid = w.waiting_gpid
WHERE a.application_name = $1)`
		}
		err := pool.QueryRow(context.Background(), q, s.app).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s does not wait on a lock after 30s", s.app)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type claimResult struct {
	claimed bool
	err     error
}

// claimAsync claims id in a new transaction on s, and commits it if
// claimed; the result comes on the channel.
func claimAsync(ctx context.Context, store *pgdedup.Store, s *session, id string, opts pgx.TxOptions, claimOpts ...pgdedup.Option) <-chan claimResult {
	done := make(chan claimResult, 1)
	go func() {
		tx, err := s.conn.BeginTx(ctx, opts)
		if err != nil {
			done <- claimResult{err: err}
			return
		}
		claimed, err := store.Claim(ctx, tx, id, claimOpts...)
		if err != nil {
			_ = tx.Rollback(ctx)
			done <- claimResult{err: err}
			return
		}
		done <- claimResult{claimed: claimed, err: tx.Commit(ctx)}
	}()
	return done
}

// setupSwitching is setupPartitioned with partitions kept
// ahead by keepPartitions and short waits for Cleanup: for tests that hold
// claims open across partition switches. If timed, the claims of b.opts
// carry times (bounded claims).
func setupSwitching(t *testing.T, timed bool) *bundle {
	t.Helper()
	var b *bundle
	if timed {
		b = withTimes(setupPartitioned(t, pgdedup.Config{Retention: 20 * time.Second, Partitions: 10, SentAtMargin: boundedMargin}))
	} else {
		b = setupPartitioned(t, pgdedup.Config{})
	}
	keepPartitions(t, b)
	pgdedup.SetPartitionWaits(b.store, 10*time.Millisecond, time.Second)
	return b
}

// openClaim begins a transaction on s, claims id in it and returns it open,
// with the claim's processed_at.
func openClaim(t *testing.T, ctx context.Context, b *bundle, s *session, id string) (pgx.Tx, time.Time) {
	t.Helper()
	tx, err := s.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if claimed, err := b.store.Claim(ctx, tx, id, b.opts(id)...); err != nil || !claimed {
		t.Fatalf("claim of %s: %v, %v", id, claimed, err)
	}
	// The claim's own row, the newest (hand-over copies carry the start of
	// older partitions).
	var at time.Time
	if err := tx.QueryRow(ctx, `SELECT max(processed_at) FROM processed_messages WHERE message_id = $1`, id).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return tx, at
}

// A claim still open when the next partition begins, and a claim of the same
// ID after the switch: the second waits for the first on the older
// partition's index (not sealed while the first is open), then skips it if
// it committed, or claims it if it rolled back. Once both ended, Cleanup
// seals, and a third claim finds the ID by looking it up.
func TestPartitionedClaimInFlightAcrossSwitch(t *testing.T) {
	t.Parallel()
	timeVariants(t, testClaimInFlightAcrossSwitch)
}

func testClaimInFlightAcrossSwitch(t *testing.T, timed bool) {
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "commit", false: "rollback"}[commit], func(t *testing.T) {
			t.Parallel()
			b := setupSwitching(t, timed)
			ctx := ctxT(t)
			first, second := newSession(t, b), newSession(t, b)
			txA, startA := openClaim(t, ctx, b, first, "x")
			waitSwitch(t, b.pool)
			cleanupHeldUp(t, ctx, b.store)
			if _, sealed := partitionClock(t, b.pool); sealed.After(startA) {
				t.Fatalf("the first claim's partition was sealed (before %s) while it was open (claimed at %s)", sealed, startA)
			}
			res := claimAsync(ctx, b.store, second, "x", pgx.TxOptions{}, b.opts("x")...)
			second.waitLocked(t, b.pool)
			var err error
			if commit {
				err = txA.Commit(ctx)
			} else {
				err = txA.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := receive(t, res, "the second claim")
			if r.err != nil || r.claimed == commit {
				t.Fatalf("second claim after the first's %s: claimed=%v err=%v, want %v", map[bool]string{true: "commit", false: "rollback"}[commit], r.claimed, r.err, !commit)
			}
			// Sealed once both claims ended (a run that finds the keeper's
			// probe of a partition holding the table waits for the next).
			current, _ := partitionClock(t, b.pool)
			cleanupUntil(ctx, t, b, b.store, "the partitions before "+current.String()+" sealed once both claims ended", func() bool {
				_, sealed := partitionClock(t, b.pool)
				return !sealed.Before(current)
			})
			if processed, err := b.store.Process(ctx, "x", charge("x"), b.opts("x")...); err != nil || processed {
				t.Errorf("third claim, by look-up: processed=%v err=%v, want a duplicate", processed, err)
			}
		})
	}
}

// A transaction that claims an ID and stays open over several switches
// keeps its partition from being sealed; meanwhile other IDs are claimed as
// usual, and the same ID waits for it. Once it commits, sealing catches up
// and the ID is a duplicate. A transaction that began before the switches
// but claims only after them (nothing of the table locked meanwhile, so
// sealing went on) sees an ID committed meanwhile: in READ COMMITTED as a
// duplicate; in REPEATABLE READ, whose snapshot predates the commit, as a
// duplicate or a serialization failure, never as new.
func TestPartitionedTxOpenAcrossSwitches(t *testing.T) {
	t.Parallel()
	timeVariants(t, testTxOpenAcrossSwitches)
}

func testTxOpenAcrossSwitches(t *testing.T, timed bool) {
	b := setupSwitching(t, timed)
	ctx := ctxT(t)
	long, waiter := newSession(t, b), newSession(t, b)
	txL, start := openClaim(t, ctx, b, long, "held")
	var pid int32
	if err := txL.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		waitSwitch(t, b.pool)
		// Held up for over a span by the third switch: starved, naming it.
		if err := cleanupHeldUp(t, ctx, b.store); i == 2 && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("pid %d ", pid))) {
			t.Fatalf("switch %d: Cleanup returned %v, want ErrCleanupStarved naming pid %d", i+1, err, pid)
		}
		if _, sealed := partitionClock(t, b.pool); sealed.After(start) {
			t.Fatalf("switch %d: sealed before %s while a claim of the partition at %s is open", i+1, sealed, start)
		}
		if processed, err := b.store.Process(ctx, pgtest.SeedID("other-", i), charge("other"), b.opts(pgtest.SeedID("other-", i))...); err != nil || !processed {
			t.Fatalf("switch %d: another ID: processed=%v err=%v", i+1, processed, err)
		}
	}
	res := claimAsync(ctx, b.store, waiter, "held", pgx.TxOptions{}, b.opts("held")...)
	waiter.waitLocked(t, b.pool)
	if err := txL.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := receive(t, res, "the waiting claim"); r.err != nil || r.claimed {
		t.Fatalf("claim after the long one committed: claimed=%v err=%v, want a duplicate", r.claimed, r.err)
	}
	current, _ := partitionClock(t, b.pool)
	cleanupUntil(ctx, t, b, b.store, "every partition before "+current.String()+" sealed", func() bool {
		_, sealed := partitionClock(t, b.pool)
		return !sealed.Before(current)
	})

	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		id := "late-" + string(iso)
		// Takes its snapshot now (REPEATABLE READ, SERIALIZABLE), locks nothing
		// of processed_messages.
		txE, err := long.conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, txE, `SELECT count(*) FROM charges`)
		for range 2 {
			waitSwitch(t, b.pool)
			if _, err := b.store.Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if processed, err := b.store.Process(ctx, id, charge(id), b.opts(id)...); err != nil || !processed {
			t.Fatalf("%s: the ID committed meanwhile: processed=%v err=%v", iso, processed, err)
		}
		claimed, err := b.store.Claim(ctx, txE, id, b.opts(id)...)
		switch {
		case err == nil && claimed:
			t.Errorf("%s: a transaction older than the switches claimed %q, committed meanwhile, as new", iso, id)
		case err != nil && (iso == pgx.ReadCommitted || !pgdedup.IsTransient(err)):
			t.Errorf("%s: claim of %q: %v", iso, id, err)
		}
		_ = txE.Rollback(ctx)
	}
}

// With LockTimeout, a claim of an ID that a transaction open across the
// switch holds gives up with ErrInFlight, and succeeds as a duplicate once
// that transaction committed.
func TestPartitionedLockTimeoutAcrossSwitch(t *testing.T) {
	t.Parallel()
	b := setupPartitioned(t, pgdedup.Config{})
	keepPartitions(t, b)
	ctx := ctxT(t)
	bounded, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "billing", LockTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if claimed, err := b.store.Claim(ctx, tx, "x"); err != nil || !claimed {
		t.Fatalf("first claim: %v, %v", claimed, err)
	}
	waitSwitch(t, b.pool)
	if _, err := bounded.Process(ctx, "x", charge("x")); !errors.Is(err, pgdedup.ErrInFlight) {
		t.Fatalf("claim during the first's transaction: %v, want ErrInFlight", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if processed, err := bounded.Process(ctx, "x", charge("x")); err != nil || processed {
		t.Fatalf("claim after the first committed: processed=%v err=%v, want a duplicate", processed, err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM charges`); n != 0 {
		t.Errorf("%d charges, want 0 (the first claim charged nothing)", n)
	}
}

// The cleaner drops a partition while a transaction reads it: the DETACH …
// CONCURRENTLY waits for that transaction, without holding up claims; cut
// short (detach wait over) it is left pending and finished by a later run.
// The reader, a REPEATABLE READ transaction, still finds the ID until it
// ends; once its partitions are dropped it is forgotten. The ID is claimed
// just after a switch, before the seal (a transaction holds the table), so
// it is in two partitions or more: its own and a hand-over copy in each
// unsealed one before it. The oldest goes first.
func TestPartitionedDropWhileRead(t *testing.T) {
	t.Parallel()
	// 2-second partitions (4 on Citus, whose ATTACH is slow on a loaded
	// machine), and time enough before old expires by itself.
	partitions := 60
	if pgtest.CitusColumn() != "" {
		partitions = 30
	}
	b := setupPartitioned(t, pgdedup.Config{Retention: 2 * time.Minute, Partitions: partitions})
	keepPartitions(t, b)
	ctx := ctxT(t)
	// The cleaner's Retention: partitions may go a second after they end.
	cleaner, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "cleaner", Retention: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	pgdedup.SetNoCarry(cleaner) // old's partitions stay while it lives
	holder := newSession(t, b)
	txH, err := holder.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, txH, `SELECT FROM processed_messages LIMIT 0`)
	waitSwitch(t, b.pool)
	if processed, err := b.store.Process(ctx, "old", charge("old")); err != nil || !processed {
		t.Fatalf("old: %v, %v", processed, err)
	}
	if err := txH.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// oldPart: the oldest partition holding old; oldAt: its newest row, the
	// claim's own.
	var oldPart string
	var oldAt time.Time
	var copies int
	var oldFrom time.Time
	if err := b.pool.QueryRow(ctx, `SELECT min(processed_at), max(processed_at), count(*)
FROM processed_messages WHERE message_id = 'old'`).Scan(&oldFrom, &oldAt, &copies); err != nil {
		t.Fatal(err)
	}
	// The partition of oldFrom (on Citus a row's tableoid is its shard's).
	if err := b.pool.QueryRow(ctx, `SELECT c.oid::regclass::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'processed_messages'::regclass
AND $1 >= (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)'))[1]::timestamptz
ORDER BY c.relname DESC LIMIT 1`, oldFrom).Scan(&oldPart); err != nil {
		t.Fatal(err)
	}
	if copies < 2 {
		t.Fatalf("old is in %d partition(s), want its own and a hand-over copy (claimed after a switch, before the seal)", copies)
	}
	// Seal old's partitions, drop the empty ones before them (made by Setup).
	cleanupUntil(ctx, t, b, cleaner, "old's partitions sealed, none before them", func() bool {
		_, sealed := partitionClock(t, b.pool)
		return sealed.After(oldAt) && pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'processed_messages'::regclass AND c.relname < $1`, oldPart) == 0
	})

	reader := newSession(t, b)
	txR, err := reader.conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer txR.Rollback(ctx)
	if claimed, err := b.store.Claim(ctx, txR, "old"); err != nil || claimed {
		t.Fatalf("reader's claim of old: claimed=%v err=%v, want a duplicate (found in its sealed partitions)", claimed, err)
	}
	expire(t, b, "billing")

	if pgtest.CitusColumn() != "" {
		// Citus refuses DETACH … CONCURRENTLY: the plain DETACH waits for the
		// reader at most its lock timeout and leaves the partition to the
		// next run; the reader still finds old.
		if _, err := cleaner.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits WHERE inhrelid = to_regclass($1)`, oldPart); n != 1 {
			t.Fatalf("%s detached while a transaction reads it", oldPart)
		}
		if claimed, err := b.store.Claim(ctx, txR, "old"); err != nil || claimed {
			t.Fatalf("reader's second claim of old: claimed=%v err=%v, want a duplicate", claimed, err)
		}
		if err := txR.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	} else {
		dropWhileReadPending(ctx, t, b, cleaner, txR, oldPart)
	}
	// Then the rest of old's partitions go (and oldPart, if that run was
	// cut short).
	cleanupUntil(ctx, t, b, cleaner, "every partition holding old dropped", func() bool {
		return pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE message_id = 'old'`) == 0 &&
			pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'processed_messages'::regclass AND inhdetachpending`) == 0
	})
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_class WHERE oid = to_regclass($1)`, oldPart); n != 0 {
		t.Errorf("%s still exists (detached, not dropped)", oldPart)
	}
	if processed, err := b.store.Process(ctx, "old", charge("old")); err != nil || !processed {
		t.Errorf("old after its partitions were dropped: processed=%v err=%v, want processed (forgotten)", processed, err)
	}
}

// dropWhileReadPending is TestPartitionedDropWhileRead's detach on plain
// PostgreSQL: DETACH … CONCURRENTLY cut short by the reader txR, left
// pending, and finalized once txR ends.
func dropWhileReadPending(ctx context.Context, t *testing.T, b *bundle, cleaner *pgdedup.Store, txR pgx.Tx, oldPart string) {
	t.Helper()
	// Cut short: left pending (a detach cut short before it marked the
	// partition changes nothing: try again).
	pgdedup.SetPartitionWaits(cleaner, 5*time.Second, 3*time.Second)
	cleanupUntil(ctx, t, b, cleaner, oldPart+" pending detach", func() bool { return detaching(t, b, oldPart) })
	// Finished by the next run, once the reader ends (FINALIZE waits for the
	// transactions that may read the partition before it locks it); claims
	// go on meanwhile.
	pgdedup.SetPartitionWaits(cleaner, 5*time.Second, time.Minute)
	done := make(chan error, 1)
	go func() { _, err := cleaner.Cleanup(ctx); done <- err }()
	if processed, err := b.store.Process(ctx, "during", charge("during")); err != nil || !processed {
		t.Fatalf("claim while the detach waits: processed=%v err=%v", processed, err)
	}
	if claimed, err := b.store.Claim(ctx, txR, "old"); err != nil || claimed {
		t.Fatalf("reader's second claim of old: claimed=%v err=%v, want a duplicate", claimed, err)
	}
	if err := txR.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := receive(t, done, "the Cleanup that finalizes"); err != nil {
		t.Fatal(err)
	}
}

// cleanupUntil runs store's Cleanup until done holds, and fails after a
// minute saying what it waited for and showing the partitions (a hang guard:
// it returns as soon as done holds).
func cleanupUntil(ctx context.Context, t *testing.T, b *bundle, store *pgdedup.Store, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("Cleanup for a minute, and still not %s; partitions: %s", what, partitionsNow(t, b))
		}
		// A transaction the test holds open may hold sealing up.
		if _, err := store.Cleanup(ctx); err != nil && !errors.Is(err, pgdedup.ErrCleanupStarved) {
			t.Fatalf("Cleanup, waiting for %s: %v", what, err)
		}
	}
}

// partitionsNow describes the partitions of processed_messages and the rows
// in each, for failure messages.
func partitionsNow(t *testing.T, b *bundle) string {
	t.Helper()
	var s string
	err := b.pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(format('%s%s [%s]', c.relname,
  CASE WHEN i.inhdetachpending THEN ' (detaching)' ELSE '' END,
  (SELECT string_agg(x.message_id || ' expires ' || x.expires_at, ', ') FROM processed_messages x WHERE x.tableoid = c.oid)), '; ' ORDER BY c.relname), 'none')
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'processed_messages'::regclass`).Scan(&s)
	if err != nil {
		return err.Error()
	}
	return s + fmt.Sprintf(" (sealed before %s)", func() time.Time { _, sealed := partitionClock(t, b.pool); return sealed }())
}

// detaching reports whether partition is pending detach.
func detaching(t *testing.T, b *bundle, partition string) bool {
	t.Helper()
	return pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits WHERE inhrelid = to_regclass($1) AND inhdetachpending`, partition) == 1
}

// Cleanup reports the partitions it created and dropped in its EventCleanup
// (nil on a plain table): after a switch, the one partitionsAhead spans
// ahead is created, and the past one Setup made and those after it before
// the current one, empty and a Retention (the cleaner's, a second) past
// their end, are dropped, oldest first.
func TestPartitionedCleanupEvent(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	runs := make(chan pgdedup.Event, 1)
	onEvent := func(_ context.Context, e pgdedup.Event) {
		if e.Kind == pgdedup.EventCleanup {
			runs <- e
		}
	}
	plain := setup(t, pgdedup.Config{OnEvent: onEvent})
	if _, err := plain.store.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if e := receive(t, runs, "the plain table's cleanup event"); e.Created != nil || e.Dropped != nil {
		t.Errorf("plain table: created %v, dropped %v, want nil", e.Created, e.Dropped)
	}

	b := setupPartitioned(t, pgdedup.Config{}) // 2-second partitions
	var past pgdedup.PartitionSpan
	if err := b.pool.QueryRow(ctx, `SELECT c.relname::text, b.m[1]::timestamptz, b.m[2]::timestamptz
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\) TO \(''([^'']*)''\)') AS b(m)
WHERE i.inhparent = 'processed_messages'::regclass ORDER BY 2 LIMIT 1`).Scan(&past.Name, &past.From, &past.To); err != nil {
		t.Fatal(err)
	}
	cleaner, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "cleaner", Retention: time.Second, OnEvent: onEvent})
	if err != nil {
		t.Fatal(err)
	}
	waitSwitch(t, b.pool)
	// The clock moves while Cleanup runs (seconds on a loaded Citus
	// cluster, each partition a distributed DDL): its partitions are judged
	// against the current partition before and after it.
	before, _ := partitionClock(t, b.pool)
	if _, err := cleaner.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	e := receive(t, runs, "the cleanup event")
	current, _ := partitionClock(t, b.pool)
	if len(e.Dropped) == 0 || e.Dropped[0].Name != past.Name || !e.Dropped[0].From.Equal(past.From) || !e.Dropped[0].To.Equal(past.To) || e.Count != 0 {
		t.Errorf("dropped %+v (%d rows), want the empty past partition %+v first", e.Dropped, e.Count, past)
	}
	for i, p := range e.Dropped {
		if p.To.After(current) || i > 0 && !p.From.Equal(e.Dropped[i-1].To) ||
			pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_class WHERE oid = to_regclass($1)`, p.Name) != 0 {
			t.Errorf("dropped %+v: want gone, oldest first, all before the current partition (%s)", e.Dropped, current)
		}
	}
	if len(e.Created) == 0 {
		t.Fatalf("created nothing after a switch")
	}
	last := e.Created[len(e.Created)-1]
	if lo, hi := before.Add(2*2*time.Second), current.Add(3*2*time.Second); last.From.Before(lo) || last.From.After(hi) {
		t.Errorf("created %+v, want the partition 3 spans after the current one (%s before Cleanup, %s after) last", e.Created, before, current)
	}
	for _, p := range e.Created {
		// One the clock left behind meanwhile may be dropped already (the
		// cleaner's Retention is 1 s).
		attached := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits WHERE inhrelid = to_regclass($1)`, p.Name) == 1
		if p.To.Sub(p.From) != 2*time.Second || !attached && p.To.After(current.Add(-time.Second)) {
			t.Errorf("created %+v: want a 2-second partition of the table", p)
		}
	}
}

// Two tables whose names share their first 30 bytes, in one schema: each
// gets partitions of its own (names within PostgreSQL's 63 bytes, index
// names too), and claims on both work. Partitions named as releases before
// the hash named them (the name cut to 30 bytes) keep working: Cleanup
// covers and drops them as any.
func TestPartitionedLongTableNames(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	names := []string{"processed_messages_of_the_billing_service_eu", "processed_messages_of_the_billing_service_us"}
	for _, name := range names {
		mustExec(t, b.pool, `CREATE TABLE `+name+` (LIKE processed_messages INCLUDING ALL)`)
		b.db.Distribute(t, name, pgtest.CitusColumn(), false)
	}
	var stores []*pgdedup.Store
	for _, name := range names {
		// 6-second partitions: Setup on Citus takes seconds.
		store, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "billing", Table: name, Layout: pgdedup.LayoutPartitioned,
			Retention: time.Minute, Partitions: 10})
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Setup(ctx); err != nil {
			t.Fatalf("Setup of %s: %v", name, err)
		}
		if _, err := store.Cleanup(ctx); err != nil {
			t.Fatalf("Cleanup of %s: %v", name, err)
		}
		stores = append(stores, store)
	}
	for i, name := range names {
		if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits WHERE inhparent = $1::regclass`, name); n < 5 {
			t.Errorf("%s has %d partitions, want the past one, the current one and three ahead", name, n)
		}
		if processed, err := stores[i].Process(ctx, "m1", charge("m1")); err != nil || !processed {
			t.Errorf("claim on %s: processed=%v err=%v", name, processed, err)
		}
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_class WHERE relnamespace = current_schema()::regnamespace
AND relname LIKE 'processed_messages_of_%' AND length(relname) > 63 - length('_key')`); n != 0 {
		t.Errorf("%d relations whose names leave no room for an index suffix", n)
	}
	// The old names: the first table's partitions renamed as releases
	// before the hash named them (the new prefix is 30 bytes too).
	mustExec(t, b.pool, `DO $$ DECLARE r record; BEGIN
FOR r IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = '`+names[0]+`'::regclass LOOP
  EXECUTE format('ALTER TABLE %I RENAME TO %I', r.relname, left('`+names[0]+`', 30) || substr(r.relname, 31));
END LOOP; END $$`)
	cleaner, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "cleaner", Table: names[0], Retention: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	past := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits WHERE inhparent = $1::regclass`, names[0])
	for pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass AND c.relname LIKE $2 || '\_p%'`, names[0], names[0][:30]) == past {
		waitSwitch2(t, b.pool, names[0])
		if _, err := cleaner.Cleanup(ctx); err != nil && !errors.Is(err, pgdedup.ErrCleanupStarved) {
			t.Fatalf("Cleanup with partitions of the old names: %v", err)
		}
	}
	if processed, err := stores[0].Process(ctx, "m1", charge("m1")); err != nil || processed {
		t.Errorf("m1 on %s after Cleanup: processed=%v err=%v, want a duplicate", names[0], processed, err)
	}
	if processed, err := stores[0].Process(ctx, "m2", charge("m2")); err != nil || !processed {
		t.Errorf("m2 on %s after Cleanup: processed=%v err=%v", names[0], processed, err)
	}
}

// waitSwitch2 is waitSwitch for the table named table.
func waitSwitch2(t *testing.T, pool *pgxpool.Pool, table string) {
	t.Helper()
	at := func() (now time.Time) {
		if err := pool.QueryRow(context.Background(), `SELECT date_bin(span, clock_timestamp(), '2000-01-01 00:00:00+00')
FROM pgdedup_partitions WHERE parent = $1::regclass`, table).Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now
	}
	from := at()
	for !at().After(from) {
		time.Sleep(20 * time.Millisecond)
	}
}
