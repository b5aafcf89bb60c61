package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"os"
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
	store, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "keeper"})
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
		err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
WHERE application_name = $1 AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())`, s.app).Scan(&waiting)
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
func claimAsync(ctx context.Context, store *pgdedup.Store, s *session, id string, opts pgx.TxOptions) <-chan claimResult {
	done := make(chan claimResult, 1)
	go func() {
		tx, err := s.conn.BeginTx(ctx, opts)
		if err != nil {
			done <- claimResult{err: err}
			return
		}
		claimed, err := store.Claim(ctx, tx, id)
		if err != nil {
			_ = tx.Rollback(ctx)
			done <- claimResult{err: err}
			return
		}
		done <- claimResult{claimed: claimed, err: tx.Commit(ctx)}
	}()
	return done
}

// setupSwitching is setupPartitioned (nil on Citus) with partitions kept
// ahead by keepPartitions and short waits for Cleanup: for tests that hold
// claims open across partition switches.
func setupSwitching(t *testing.T) *bundle {
	t.Helper()
	b := setupPartitioned(t, pgdedup.Config{})
	if b == nil {
		return nil
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
	if claimed, err := b.store.Claim(ctx, tx, id); err != nil || !claimed {
		t.Fatalf("claim of %s: %v, %v", id, claimed, err)
	}
	var at time.Time
	if err := tx.QueryRow(ctx, `SELECT processed_at FROM processed_messages WHERE message_id = $1`, id).Scan(&at); err != nil {
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
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "commit", false: "rollback"}[commit], func(t *testing.T) {
			t.Parallel()
			b := setupSwitching(t)
			if b == nil {
				return // Citus: refused
			}
			ctx := ctxT(t)
			first, second := newSession(t, b), newSession(t, b)
			txA, startA := openClaim(t, ctx, b, first, "x")
			waitSwitch(t, b.pool)
			if _, err := b.store.Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
			if _, sealed := partitionClock(t, b.pool); sealed.After(startA) {
				t.Fatalf("the first claim's partition was sealed (before %s) while it was open (claimed at %s)", sealed, startA)
			}
			res := claimAsync(ctx, b.store, second, "x", pgx.TxOptions{})
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
			current, _ := partitionClock(t, b.pool)
			if _, err := b.store.Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
			if _, sealed := partitionClock(t, b.pool); sealed.Before(current) {
				t.Errorf("sealed before %s, want the partitions before %s sealed once both claims ended", sealed, current)
			}
			if processed, err := b.store.Process(ctx, "x", charge("x")); err != nil || processed {
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
	b := setupSwitching(t)
	if b == nil {
		return // Citus: refused
	}
	ctx := ctxT(t)
	long, waiter := newSession(t, b), newSession(t, b)
	txL, start := openClaim(t, ctx, b, long, "held")
	for i := range 3 {
		waitSwitch(t, b.pool)
		if _, err := b.store.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		if _, sealed := partitionClock(t, b.pool); sealed.After(start) {
			t.Fatalf("switch %d: sealed before %s while a claim of the partition at %s is open", i+1, sealed, start)
		}
		if processed, err := b.store.Process(ctx, pgtest.SeedID("other-", i), charge("other")); err != nil || !processed {
			t.Fatalf("switch %d: another ID: processed=%v err=%v", i+1, processed, err)
		}
	}
	res := claimAsync(ctx, b.store, waiter, "held", pgx.TxOptions{})
	waiter.waitLocked(t, b.pool)
	if err := txL.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := receive(t, res, "the waiting claim"); r.err != nil || r.claimed {
		t.Fatalf("claim after the long one committed: claimed=%v err=%v, want a duplicate", r.claimed, r.err)
	}
	current, _ := partitionClock(t, b.pool)
	if _, err := b.store.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if _, sealed := partitionClock(t, b.pool); sealed.Before(current) {
		t.Errorf("sealed before %s, want every partition before %s sealed", sealed, current)
	}

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
		if processed, err := b.store.Process(ctx, id, charge(id)); err != nil || !processed {
			t.Fatalf("%s: the ID committed meanwhile: processed=%v err=%v", iso, processed, err)
		}
		claimed, err := b.store.Claim(ctx, txE, id)
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
	if b == nil {
		return // Citus: refused
	}
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
// The reader, a REPEATABLE READ transaction, still finds the partition's IDs
// until it ends; once the partition is dropped they are forgotten.
func TestPartitionedDropWhileRead(t *testing.T) {
	t.Parallel()
	// 2-second partitions, and time enough before old expires by itself.
	b := setupPartitioned(t, pgdedup.Config{Retention: 2 * time.Minute, Partitions: 60})
	if b == nil {
		return // Citus: refused
	}
	keepPartitions(t, b)
	ctx := ctxT(t)
	// The cleaner's Retention: partitions may go a second after they end.
	cleaner, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "cleaner", Retention: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if processed, err := b.store.Process(ctx, "old", charge("old")); err != nil || !processed {
		t.Fatalf("old: %v, %v", processed, err)
	}
	var oldPart string
	var oldAt time.Time
	if err := b.pool.QueryRow(ctx, `SELECT tableoid::regclass::text, processed_at FROM processed_messages WHERE message_id = 'old'
ORDER BY processed_at DESC LIMIT 1`).Scan(&oldPart, &oldAt); err != nil {
		t.Fatal(err)
	}
	waitSwitch(t, b.pool)
	// Seal old's partition, drop the empty ones before it (made by Setup).
	for {
		_, sealed := partitionClock(t, b.pool)
		if sealed.After(oldAt) && pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'processed_messages'::regclass AND c.relname < $1`, oldPart) == 0 {
			break
		}
		if _, err := cleaner.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
	}

	reader := newSession(t, b)
	txR, err := reader.conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer txR.Rollback(ctx)
	if claimed, err := b.store.Claim(ctx, txR, "old"); err != nil || claimed {
		t.Fatalf("reader's claim of old: claimed=%v err=%v, want a duplicate (found in its sealed partition)", claimed, err)
	}
	expire(t, b, "billing")

	// Cut short: left pending (a detach cut short before it marked the
	// partition changes nothing: try again).
	pgdedup.SetPartitionWaits(cleaner, 5*time.Second, 3*time.Second)
	for !detaching(t, b, oldPart) {
		if _, err := cleaner.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
	}
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
	// (It finalizes unless it met the keeper's detach: then a later run.)
	for pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_class WHERE oid = to_regclass($1)`, oldPart) != 0 {
		if _, err := cleaner.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if processed, err := b.store.Process(ctx, "old", charge("old")); err != nil || !processed {
		t.Errorf("old after its partition was dropped: processed=%v err=%v, want processed (forgotten)", processed, err)
	}
}

// detaching reports whether partition is pending detach.
func detaching(t *testing.T, b *bundle, partition string) bool {
	t.Helper()
	return pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits WHERE inhrelid = to_regclass($1) AND inhdetachpending`, partition) == 1
}
