package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// upgradeRows is how many rows the table holds when migration 00003 runs in
// TestUpgradeInPlace: 100,000 by default (CI), PGDEDUP_UPGRADE_ROWS to change
// it (a million rows shows the upgrade at a size where it takes minutes).
func upgradeRows(t *testing.T) int {
	n := 100_000
	if v := os.Getenv("PGDEDUP_UPGRADE_ROWS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("PGDEDUP_UPGRADE_ROWS=%q is not a positive count", v)
		}
	}
	return n
}

// oldClaim is the claim of pgdedup before migration 00003, as instances not
// yet upgraded keep sending it during a rolling deploy.
const oldClaim = `INSERT INTO processed_messages (consumer, message_id, expires_at)
VALUES ($1, $2, now() + interval '48 hours') ON CONFLICT DO NOTHING`

// Migration 00003 rebuilds the primary key of a populated table while eight
// consumers keep processing messages: new ones, duplicates delivered
// concurrently, and redeliveries of old and recent IDs. The consumers run the
// old claim during Up, this version's Process after it, and the old claim
// again during Down. Afterwards every message was charged exactly once and no
// redelivery was charged. How long claims waited is logged per phase (the
// figure docs/operations.md quotes), not asserted: that claims never queue
// behind the migration is shown by mechanism in TestUpgradeLockAttemptsGiveWay.
func TestUpgradeInPlace(t *testing.T) {
	t.Parallel()
	rows := upgradeRows(t)
	db := pgtest.NewUnmigrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	p, err := pgdedup.NewMigrationProvider(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 2); err != nil {
		t.Fatal(err)
	}
	// The rows already there: random UUIDs, one in ten under another consumer.
	pgtest.Exec(t, db.Pool, `INSERT INTO processed_messages (consumer, message_id, processed_at, expires_at)
SELECT CASE WHEN g % 10 = 0 THEN 'emails' ELSE 'billing' END, gen_random_uuid()::text, now(), now() + interval '2 days'
FROM generate_series(1, $1::int) g`, rows)
	pgtest.Exec(t, db.Pool, `CREATE TABLE charges (order_id text NOT NULL)`)
	var old []string
	r, err := db.Pool.Query(ctx, `SELECT message_id FROM processed_messages WHERE consumer = 'billing' LIMIT 5000`)
	if err == nil {
		old, err = pgx.CollectRows(r, pgx.RowTo[string])
	}
	if err != nil {
		t.Fatal(err)
	}

	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	c := &upgradeConsumers{store: store, pool: db, old: old}
	stop := c.start(ctx, 8)
	phase := func(name string, useNew bool, run func() error) {
		t.Helper()
		c.useNew.Store(useNew)
		c.resetLatency()
		before, t0 := c.deliveries.Load(), time.Now()
		if err := run(); err != nil {
			stop()
			t.Fatalf("%s: %v", name, err)
		}
		t.Logf("%s: %s, %d deliveries, longest claim %s", name, time.Since(t0).Round(time.Millisecond),
			c.deliveries.Load()-before, time.Duration(c.maxLatency.Load()).Round(time.Millisecond))
	}
	waitDeliveries := func(n int64) func() error {
		return func() error {
			for target := c.deliveries.Load() + n; c.deliveries.Load() < target; time.Sleep(10 * time.Millisecond) {
				if err := c.failed(); err != nil {
					return err
				}
			}
			return nil
		}
	}

	phase("old code, version 2", false, waitDeliveries(300))
	phase("old code, Up to 3", false, func() error { _, err := p.UpTo(ctx, 3); return err })
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages WHERE key IS DISTINCT FROM pgdedup_key(consumer, message_id)`); n != 0 {
		t.Errorf("%d rows without their key after Up", n)
	}
	if pk := primaryKeyOf(t, db); pk != "PRIMARY KEY (key)" {
		t.Errorf("primary key after Up: %s", pk)
	}
	phase("old code, version 3", false, waitDeliveries(300))
	phase("new code, version 3", true, waitDeliveries(600))
	phase("old code, version 3 again", false, waitDeliveries(300))
	phase("old code, Down to 2", false, func() error { _, err := p.DownTo(ctx, 2); return err })
	phase("old code, version 2 again", false, waitDeliveries(300))
	stop()
	if err := c.failed(); err != nil {
		t.Fatal(err)
	}
	if pk := primaryKeyOf(t, db); pk != "PRIMARY KEY (consumer, message_id)" {
		t.Errorf("primary key after Down: %s", pk)
	}

	// Each new message charged once, no redelivery charged, every charge recorded.
	fresh := c.freshCount()
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM charges`); n != fresh {
		t.Errorf("%d charges for %d new messages", n, fresh)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) - count(DISTINCT order_id) FROM charges`); n != 0 {
		t.Errorf("%d messages charged twice", n)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM charges WHERE order_id NOT LIKE 'new-%'`); n != 0 {
		t.Errorf("%d redeliveries of old IDs charged", n)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM charges c WHERE NOT EXISTS
(SELECT 1 FROM processed_messages p WHERE p.consumer = 'billing' AND p.message_id = c.order_id)`); n != 0 {
		t.Errorf("%d charges without their claim", n)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages`); n != rows+fresh {
		t.Errorf("%d rows, want %d old and %d new", n, rows, fresh)
	}
	t.Logf("%d rows before; %d deliveries, %d new messages, %d duplicates skipped",
		rows, c.deliveries.Load(), fresh, c.duplicates.Load())
}

// While a long transaction holds processed_messages (here a reader that
// stays open), migration 00003 cannot take its lock. Each attempt gives up
// after its lock_timeout and retries after a pause instead of waiting in the
// lock queue, where every claim would queue behind it for as long as the
// transaction lasts. Shown by mechanism, not by the clock: the migration is
// seen blocked by the holder, then pausing between attempts; claims complete
// while it still waits; it completes once the holder ends.
func TestUpgradeLockAttemptsGiveWay(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	// Not a measure of speed: a claim queued behind an ALTER without
	// lock_timeout would wait for the holder, which ends only after the
	// claims, so the test would hang; this turns a hang into a failure.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	p, err := pgdedup.NewMigrationProvider(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 2); err != nil {
		t.Fatal(err)
	}
	holder, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(context.Background()) //nolint:errcheck // no-op after Rollback
	var holderPID int
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid() FROM (SELECT count(*) FROM processed_messages) AS held`).Scan(&holderPID); err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)
	go func() { _, err := p.UpTo(ctx, 3); done <- err }()
	// poll runs q, a query of one integer, until it returns a row.
	poll := func(what, q string, args ...any) int {
		t.Helper()
		for {
			var n int
			err := db.Pool.QueryRow(ctx, q, args...).Scan(&n)
			if err == nil {
				return n
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				t.Fatalf("waiting for %s: %v", what, err)
			}
			select {
			case err := <-done:
				t.Fatalf("the migration ended (%v) before %s, while the table was held", err, what)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	// The session waiting for a lock on this test's table behind the holder
	// (other tests' CREATE INDEX CONCURRENTLY wait for the holder too, but on
	// no relation lock of this table).
	migPID := poll("the migration to wait for the holder's lock",
		`SELECT pid FROM pg_locks WHERE NOT granted AND locktype = 'relation'
AND relation = $2::regclass AND $1::int = ANY(pg_blocking_pids(pid)) LIMIT 1`, holderPID, db.Schema+".processed_messages")
	poll("the migration to give up its lock attempt and pause",
		`SELECT pid FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'PgSleep'`, migPID)

	for i := range 20 {
		if _, err := db.Pool.Exec(ctx, oldClaim, "billing", fmt.Sprintf("during-%d", i)); err != nil {
			t.Fatalf("claim %d while the migration waits: %v", i, err)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("the migration ended (%v) while the table was held", err)
	default:
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, migPID); n != 1 {
		t.Fatalf("the migration's session %d is gone while the table was held", migPID)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("migration after the holder ended: %v", err)
	}
	if pk := primaryKeyOf(t, db); pk != "PRIMARY KEY (key)" {
		t.Errorf("primary key after Up: %s", pk)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages WHERE message_id LIKE 'during-%' AND key = pgdedup_key(consumer, message_id)`); n != 20 {
		t.Errorf("%d of the 20 claims made while the migration waited are there with their key", n)
	}
}

func primaryKeyOf(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	var pk string
	err := db.Pool.QueryRow(context.Background(), `SELECT pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = 'processed_messages'::regclass AND contype = 'p'`).Scan(&pk)
	if err != nil {
		t.Fatal(err)
	}
	return pk
}

// upgradeConsumers deliver messages to the billing consumer from several
// goroutines, with the old claim or this version's Process.
type upgradeConsumers struct {
	store *pgdedup.Store
	pool  *pgtest.DB
	old   []string // IDs recorded before the test: redelivered, never to be charged

	useNew     atomic.Bool
	deliveries atomic.Int64
	duplicates atomic.Int64
	maxLatency atomic.Int64 // the longest claim (BEGIN and the claim's round trip), ns

	mu     sync.Mutex
	fresh  map[string]bool // new IDs delivered (true once acked)
	recent []string
	err    error
}

// start starts the broker and the workers. stop stops the broker and waits
// for the workers to finish the deliveries they hold, so that every commit is
// acked (none is cut by a cancelled context).
func (c *upgradeConsumers) start(ctx context.Context, workers int) (stop func()) {
	brokerCtx, cancel := context.WithCancel(ctx)
	c.fresh = map[string]bool{}
	ids := make(chan string)
	var wg sync.WaitGroup
	wg.Go(func() { // the broker: new IDs, some delivered twice at once, and redeliveries
		defer close(ids)
		for n := 0; ; n++ {
			var batch []string
			switch r := rand.IntN(10); {
			case r < 5:
				id := fmt.Sprintf("new-%d", n)
				batch = []string{id}
				if rand.IntN(4) == 0 {
					batch = append(batch, id) // to two consumers at once
				}
			case r < 7:
				batch = []string{c.old[rand.IntN(len(c.old))]}
			default:
				c.mu.Lock()
				if len(c.recent) > 0 {
					batch = []string{c.recent[rand.IntN(len(c.recent))]}
				}
				c.mu.Unlock()
			}
			for _, id := range batch {
				select {
				case ids <- id:
				case <-brokerCtx.Done():
					return
				}
			}
		}
	})
	for range workers {
		wg.Go(func() {
			for id := range ids {
				if err := c.deliver(ctx, id); err != nil {
					c.mu.Lock()
					c.err = cmpErr(c.err, fmt.Errorf("delivery of %s: %w", id, err))
					c.mu.Unlock()
					cancel()
					for range ids { // drain, so the broker ends
					}
					return
				}
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func (c *upgradeConsumers) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *upgradeConsumers) resetLatency() { c.maxLatency.Store(0) }

func (c *upgradeConsumers) freshCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, acked := range c.fresh {
		if acked {
			n++
		}
	}
	return n
}

func (c *upgradeConsumers) latency(d time.Duration) {
	for {
		cur := c.maxLatency.Load()
		if int64(d) <= cur || c.maxLatency.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// deliver processes id once and acks it; any failure is an error.
func (c *upgradeConsumers) deliver(ctx context.Context, id string) error {
	isNew := len(id) > 4 && id[:4] == "new-"
	c.mu.Lock()
	if isNew {
		if _, ok := c.fresh[id]; !ok {
			c.fresh[id] = false
		}
	}
	c.mu.Unlock()
	var charged bool
	var err error
	if c.useNew.Load() {
		t0 := time.Now()
		charged, err = c.store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
			c.latency(time.Since(t0))
			_, err := tx.Exec(ctx, `INSERT INTO charges (order_id) VALUES ($1)`, id)
			return err
		})
	} else {
		charged, err = c.deliverOld(ctx, id)
	}
	if err != nil {
		return err
	}
	c.deliveries.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if isNew {
		c.fresh[id] = true
		if len(c.recent) < 10_000 {
			c.recent = append(c.recent, id)
		} else {
			c.recent[rand.IntN(len(c.recent))] = id
		}
	}
	if !charged {
		c.duplicates.Add(1)
	}
	return nil
}

// deliverOld is Process as pgdedup did it before 00003: BEGIN and the claim
// pipelined, the charge, COMMIT.
func (c *upgradeConsumers) deliverOld(ctx context.Context, id string) (bool, error) {
	t0 := time.Now()
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(oldClaim, "billing", id)
	br := c.pool.Pool.SendBatch(ctx, b)
	tx := br.Tx()
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	var claimed bool
	_, err := br.Exec()
	if err == nil {
		tag, e := br.Exec()
		claimed, err = tag.RowsAffected() == 1, e
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	c.latency(time.Since(t0))
	if err != nil {
		return false, err
	}
	if !claimed {
		return false, tx.Rollback(ctx)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO charges (order_id) VALUES ($1)`, id); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, errors.Join(errors.New("commit"), err)
	}
	return true, nil
}
