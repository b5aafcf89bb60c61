package pgdedup_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// cleanupBatchMsg is the message Cleanup logs for each batch.
const cleanupBatchMsg = "pgdedup: cleanup batch"

// logSink captures what a Store logs (pgtest.LogCapture), reads its cleanup
// batches, and calls onBatch, when set, for each cleanup batch logged.
type logSink struct {
	pgtest.LogCapture
	onBatch func(deleted int64)
}

func (h *logSink) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logSink) WithGroup(string) slog.Handler      { return h }

func (h *logSink) Handle(ctx context.Context, r slog.Record) error {
	_ = h.LogCapture.Handle(ctx, r)
	if h.onBatch != nil && r.Message == cleanupBatchMsg {
		h.onBatch(batchDeleted(r))
	}
	return nil
}

// batches returns the rows deleted by each cleanup batch logged, in order.
func (h *logSink) batches() []int64 {
	var out []int64
	for _, r := range h.Records(cleanupBatchMsg) {
		out = append(out, batchDeleted(r))
	}
	return out
}

// batchDurations returns how long each cleanup batch took, in order.
func (h *logSink) batchDurations() []time.Duration {
	var out []time.Duration
	for _, r := range h.Records(cleanupBatchMsg) {
		v, _ := pgtest.Attr(r, "duration")
		out = append(out, v.Duration())
	}
	return out
}

func batchDeleted(r slog.Record) int64 {
	v, _ := pgtest.Attr(r, "deleted")
	return v.Int64()
}

// eventLog keeps the events reported to Config.OnEvent.
type eventLog struct {
	mu     sync.Mutex
	events []pgdedup.Event
}

func (l *eventLog) add(_ context.Context, e pgdedup.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// cleanups returns the EventCleanup events so far.
func (l *eventLog) cleanups() []pgdedup.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []pgdedup.Event
	for _, e := range l.events {
		if e.Kind == pgdedup.EventCleanup {
			out = append(out, e)
		}
	}
	return out
}

// citusBatches reports, on Citus only, whether batches are what Cleanup's
// windows of expires_at may give there: every batch between 1 and size rows,
// total rows in all. On plain PostgreSQL it returns false, leaving the exact
// batch sizes to the caller's check.
func citusBatches(t testing.TB, batches []int64, size, total int64) bool {
	t.Helper()
	if pgtest.CitusColumn() == "" {
		return false
	}
	var sum int64
	for _, n := range batches {
		if n < 1 || n > size {
			return false
		}
		sum += n
	}
	return sum == total
}

// cleanupGates stops cleaners at chosen points of their lock try, to force an
// interleaving of concurrent cleaners. It shadows pg_try_advisory_xact_lock(int,
// int) with a function of the test's schema, found first by the cleaners'
// roles (search_path: the schema, then pg_catalog), which waits on the gate
// "before" of its role, tries the real lock and, if it got it, waits on the
// gate "after". A gate is an advisory lock the test holds in an open
// transaction; opening it ends that transaction, and it stays open.
type cleanupGates struct {
	b     *bundle
	keys  int32             // the last gate key used
	roles map[string]string // each cleaner's role
}

// cleanupGateClass is the first half of the gates' advisory lock keys.
const cleanupGateClass = 1885824199

// Each lock try also sleeps a random time of up to jitter before it tries, and
// as long again once it got the lock, to widen the windows that a race between
// cleaners needs.
func newCleanupGates(t *testing.T, b *bundle, jitter time.Duration) *cleanupGates {
	t.Helper()
	mustExec(t, b.pool, `CREATE TABLE cleanup_gates (role name, point text, key int, PRIMARY KEY (role, point))`)
	mustExec(t, b.pool, fmt.Sprintf(`CREATE FUNCTION pg_try_advisory_xact_lock(k1 int, k2 int) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
	gate int;
	got boolean;
BEGIN
	SELECT key INTO gate FROM cleanup_gates WHERE role = current_user AND point = 'before';
	IF FOUND THEN PERFORM pg_catalog.pg_advisory_xact_lock_shared(%[1]d, gate); END IF;
	PERFORM pg_catalog.pg_sleep(pg_catalog.random() * %[2]f);
	got := pg_catalog.pg_try_advisory_xact_lock(k1, k2);
	SELECT key INTO gate FROM cleanup_gates WHERE role = current_user AND point = 'after';
	IF got AND FOUND THEN PERFORM pg_catalog.pg_advisory_xact_lock_shared(%[1]d, gate); END IF;
	IF got THEN PERFORM pg_catalog.pg_sleep(pg_catalog.random() * %[2]f); END IF;
	RETURN got;
END $$`, cleanupGateClass, jitter.Seconds()))
	return &cleanupGates{b: b, roles: map[string]string{}}
}

// cleaner returns a Store, with cfg, for a role of its own named by who, that
// may only SELECT and DELETE (and read the gates), on a connection of its own.
func (g *cleanupGates) cleaner(t *testing.T, who string, cfg pgdedup.Config) *pgdedup.Store {
	t.Helper()
	role, url := g.role(t)
	g.roles[who] = role
	store, err := pgdedup.New(connect(t, url), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// role creates a role that finds the gated lock try first and may only SELECT
// and DELETE (and read the gates, and record premature deletes: see
// watchPremature), and returns its name and a URL logging in as it.
func (g *cleanupGates) role(t *testing.T) (name, url string) {
	t.Helper()
	name, url = g.b.db.NewRole(t)
	mustExec(t, g.b.pool, `ALTER ROLE `+name+` SET search_path = `+g.b.db.Schema+`, pg_catalog`)
	mustExec(t, g.b.pool, `GRANT SELECT, DELETE ON processed_messages TO `+name)
	mustExec(t, g.b.pool, `GRANT SELECT ON cleanup_gates TO `+name)
	if pgtest.Count(t, g.b.pool, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'cleanup_premature'`, g.b.db.Schema) > 0 {
		mustExec(t, g.b.pool, `GRANT INSERT ON cleanup_premature TO `+name)
	}
	return name, url
}

// gate is a closed gate: the transaction holding its lock.
type gate struct {
	key int32
	tx  pgx.Tx
}

// close closes the gate point ("before" or "after") of the cleaner who.
func (g *cleanupGates) close(t *testing.T, who, point string) *gate {
	t.Helper()
	g.keys++
	key := g.keys
	tx, err := g.b.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // opens it if the test failed first
	if _, err := tx.Exec(context.Background(), `SELECT pg_advisory_xact_lock($1, $2)`, cleanupGateClass, key); err != nil {
		t.Fatal(err)
	}
	mustExec(t, g.b.pool, `INSERT INTO cleanup_gates VALUES ($1, $2, $3)`, g.roles[who], point, key)
	return &gate{key: key, tx: tx}
}

// open lets every cleaner waiting on gt, and every later one, through.
func (g *cleanupGates) open(t *testing.T, gt *gate) {
	t.Helper()
	if err := gt.tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// waitBlocked waits until a cleaner waits on gt, failing after 30 seconds.
func (g *cleanupGates) waitBlocked(t *testing.T, gt *gate) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := pgtest.Count(t, g.b.pool, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 2`, cleanupGateClass, gt.key)
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no cleaner waits on gate %d after 30s", gt.key)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// watchPremature records, in the table cleanup_premature, every row of
// processed_messages deleted before its expires_at (by the deleting
// transaction's clock, the one the DELETE compares with).
func watchPremature(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	mustExec(t, pool, `CREATE TABLE cleanup_premature (consumer text, message_id text, expires_at timestamptz, deleted_at timestamptz)`)
	mustExec(t, pool, `CREATE FUNCTION cleanup_premature() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF OLD.expires_at >= now() THEN
		INSERT INTO cleanup_premature VALUES (OLD.consumer, OLD.message_id, OLD.expires_at, now());
	END IF;
	RETURN OLD;
END $$`)
	mustExec(t, pool, `CREATE TRIGGER cleanup_premature AFTER DELETE ON processed_messages FOR EACH ROW EXECUTE FUNCTION cleanup_premature()`)
}
