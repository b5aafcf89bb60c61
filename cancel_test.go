package pgdedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// leakBundle is a pool whose sessions carry their own application_name, so
// pg_stat_activity shows which sessions are the test's, directly and behind
// PgBouncer, and a Store on it.
type leakBundle struct {
	*bundle
	app   string
	pool  *pgxpool.Pool
	store *pgdedup.Store
}

// Behind PgBouncer the test's two pools share server connections, which keep
// the last application_name set on them: the checks leave out their own session.

// setupLeak is setup plus the application_name pool and, on charges, a
// deferred trigger that makes COMMIT sleep 10 s for order "slow-commit", to
// cancel a Process while its COMMIT runs.
func setupLeak(t *testing.T) *leakBundle {
	t.Helper()
	b := setup(t, pgdedup.Config{})
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	app := "leak_" + b.db.Schema
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if n := pool.Stat().AcquiredConns(); n != 0 { // Close would wait for them forever
			t.Errorf("%d connections leaked: pool left open", n)
			return
		}
		pool.Close()
	})
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	if pgtest.CitusColumn() != "" {
		// Citus runs no triggers on distributed tables: keep charges on the
		// coordinator, in the same transactions as the distributed claims.
		mustExec(t, b.pool, `SELECT undistribute_table('charges')`)
	}
	mustExec(t, b.pool, `CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
'BEGIN PERFORM pg_sleep(10); RETURN NULL; END'`)
	mustExec(t, b.pool, `CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON charges
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.order_id = 'slow-commit') EXECUTE FUNCTION slow_commit()`)
	return &leakBundle{bundle: b, app: app, pool: pool, store: store}
}

// assertNothingLeft checks that id is not recorded and not charged, that the
// pool has no connection checked out, and that no session of the pool is left
// in a transaction or running a statement. Sessions whose client went away
// end asynchronously, so pg_stat_activity gets a few seconds to settle.
func (l *leakBundle) assertNothingLeft(t *testing.T, id string) {
	t.Helper()
	if recorded(t, l.bundle.pool, "billing", id) {
		t.Errorf("%s recorded", id)
	}
	if n := chargesPerOrder(t, l.bundle.pool)[id]; n != 0 {
		t.Errorf("%s charged %d times, want 0", id, n)
	}
	// A connection broken by the cancellation is released at once but closed in
	// the background; it counts as acquired until it is closed.
	acquired := int32(0)
	for deadline := time.Now().Add(settle); ; time.Sleep(10 * time.Millisecond) {
		if acquired = l.pool.Stat().AcquiredConns(); acquired == 0 || time.Now().After(deadline) {
			break
		}
	}
	if acquired != 0 {
		t.Errorf("%d connections still acquired from the pool after %s", acquired, settle)
	}
	const busy = `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state <> 'idle' AND pid <> pg_backend_pid()`
	n := 0
	for deadline := time.Now().Add(settle); ; time.Sleep(20 * time.Millisecond) {
		if n = pgtest.Count(t, l.bundle.pool, busy, l.app); n == 0 || time.Now().After(deadline) {
			break
		}
	}
	if n != 0 {
		var sessions string
		_ = l.bundle.pool.QueryRow(context.Background(), `SELECT string_agg(format('%s %s %s: %s', pid, state, wait_event, query), '; ')
FROM pg_stat_activity WHERE application_name = $1 AND state <> 'idle' AND pid <> pg_backend_pid()`, l.app).Scan(&sessions)
		t.Errorf("%d sessions still in a transaction or a statement after %s: %s", n, settle, sessions)
	}
}

// settle bounds the waits for the pool and the server to let go after a
// cancellation, and for a statement to show up waiting. It is a hang guard,
// not a measure of speed: each wait ends as soon as its condition holds. That
// cancellation is prompt shows by mechanism: a stage that waits on a held
// claim returns its cancellation error while the claim is still held.
const settle = 2 * time.Minute

// cancelWhen calls cancel as soon as a session of the pool runs a statement
// LIKE query while waiting on waitEvent (as pg_stat_activity reports them).
func (l *leakBundle) cancelWhen(t *testing.T, query, waitEvent string, cancel func()) {
	t.Helper()
	go func() {
		defer cancel()
		for deadline := time.Now().Add(settle); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			sql := `SELECT count(*) FROM pg_stat_activity
WHERE application_name = $1 AND query LIKE $2 AND wait_event = $3 AND pid <> pg_backend_pid()`
			if pgtest.CitusColumn() != "" {
				// On Citus the wait is on a worker, in a backend that shares
				// the global PID of the coordinator's session.
				sql = `SELECT count(*) FROM citus_stat_activity c JOIN citus_stat_activity w USING (global_pid)
WHERE c.application_name = $1 AND w.query LIKE $2 AND w.wait_event = $3 AND c.pid <> pg_backend_pid()`
			}
			var n int
			err := l.bundle.pool.QueryRow(context.Background(), sql, l.app, query, waitEvent).Scan(&n)
			if err != nil {
				t.Errorf("watching pg_stat_activity: %v", err)
				return
			}
			if n > 0 {
				return
			}
		}
		t.Errorf("no session ran %q waiting on %s within %s", query, waitEvent, settle)
	}()
}

func isCanceled(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &pgErr) && pgErr.Code == "57014") // query_canceled
}

// TestCancellationLeavesNothingOpen cancels Process, ProcessBatch, Claim,
// Cleanup and RunCleaner at every stage. Each stage must return an error, record
// nothing, and leave no connection checked out, no open transaction and, at the
// end, no goroutine. It is not parallel: goleak needs the other tests quiet.
func TestCancellationLeavesNothingOpen(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) }) // runs last, after the pools close
	l := setupLeak(t)

	for _, stage := range cancelStages {
		t.Run(stage.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			id := "msg-" + stage.name
			err := stage.run(ctx, cancel, l, t, id)
			t.Logf("returned %v", err)
			if err == nil || !stage.is(err) {
				t.Errorf("err = %v, want a cancellation", err)
			}
			l.assertNothingLeft(t, id)
		})
	}

	// The pool is still healthy: the same IDs process normally now.
	for _, stage := range cancelStages {
		id := "msg-" + stage.name
		if processed, err := l.store.Process(context.Background(), id, charge(id)); err != nil || !processed {
			t.Fatalf("%s afterwards: processed=%v err=%v, want true, nil", id, processed, err)
		}
	}
	if n := l.pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections still acquired from the pool", n)
	}
}

// errIs returns a matcher for cancelStage.is.
func errIs(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

// forTx runs fn in a transaction of l's pool that is rolled back with ctx,
// the usual `defer tx.Rollback(ctx)` of callers.
func (l *leakBundle) forTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := l.pool.Begin(context.Background())
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // ctx may be done: pgx then closes the connection
	return fn(tx)
}

// cancelStage is one point where TestCancellationLeavesNothingOpen cancels:
// run calls pgdedup with ctx, cancels it (by cancel or a watcher) at its
// stage, and returns pgdedup's error, which is must accept.
type cancelStage struct {
	name string
	run  func(ctx context.Context, cancel func(), l *leakBundle, t *testing.T, id string) error
	is   func(error) bool
}

var cancelStages = []cancelStage{
	{"before-claim", func(ctx context.Context, cancel func(), l *leakBundle, t *testing.T, id string) error {
		cancel()
		_, err := l.store.Process(ctx, id, mustNotRun(t))
		return err
	}, errIs(context.Canceled)},

	{"waiting-for-in-flight-claim", func(ctx context.Context, cancel func(), l *leakBundle, t *testing.T, id string) error {
		defer pgtest.HoldClaim(t, l.bundle.pool, l.bundle.store, id).Rollback(context.Background()) //nolint:errcheck
		l.cancelWhen(t, "%INSERT INTO%", "transactionid", cancel)
		_, err := l.store.Process(ctx, id, mustNotRun(t))
		return err
	}, isCanceled},

	{"inside-fn", func(ctx context.Context, cancel func(), l *leakBundle, t *testing.T, id string) error {
		_, err := l.store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
			cancel()
			return charge(id)(ctx, tx)
		})
		return err
	}, errIs(context.Canceled)},

	{"fn-statement-running", func(ctx context.Context, cancel func(), l *leakBundle, t *testing.T, id string) error {
		l.cancelWhen(t, "SELECT pg_sleep(10)", "PgSleep", cancel)
		_, err := l.store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
			if err := charge(id)(ctx, tx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "SELECT pg_sleep(10)")
			return err
		})
		return err
	}, isCanceled},

	{"after-fn-before-commit", func(ctx context.Context, cancel func(), l *leakBundle, t *testing.T, id string) error {
		_, err := l.store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
			defer cancel()
			return charge(id)(ctx, tx)
		})
		return err
	}, errIs(context.Canceled)},

	{"during-commit", func(ctx context.Context, cancel func(), l *leakBundle, t *testing.T, id string) error {
		l.cancelWhen(t, "commit", "PgSleep", cancel)
		_, err := l.store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
			return charge("slow-commit")(ctx, tx) // its deferred trigger sleeps in COMMIT
		})
		if n := chargesPerOrder(t, l.bundle.pool)["slow-commit"]; n != 0 {
			t.Errorf("slow-commit charged %d times, want 0", n)
		}
		return err
	}, isCanceled},

	{"retry-backoff", func(ctx context.Context, cancel func(), l *leakBundle, t *testing.T, id string) error {
		store, err := pgdedup.New(l.pool, pgdedup.Config{Consumer: "billing", MaxAttempts: 10,
			OnEvent: func(_ context.Context, e pgdedup.Event) {
				if e.Kind == pgdedup.EventRetry {
					cancel() // the backoff sleep comes next
				}
			}})
		if err != nil {
			t.Fatal(err)
		}
		calls := 0
		_, err = store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
			calls++
			_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END $$`)
			return err
		})
		if calls != 1 {
			t.Errorf("fn ran %d times, want 1: no attempt after the cancellation", calls)
		}
		return err
	}, func(err error) bool { // the last attempt's error, not ctx's
		var pgErr *pgconn.PgError
		return errors.As(err, &pgErr) && pgErr.Code == "40001"
	}},

	{"batch-fn-statement-running", func(ctx context.Context, cancel func(), l *leakBundle, t *testing.T, id string) error {
		l.cancelWhen(t, "SELECT pg_sleep(10)", "PgSleep", cancel)
		_, err := l.store.ProcessBatch(ctx, []string{id, id + "-2"}, func(ctx context.Context, tx pgx.Tx, fresh []string) error {
			if err := charge(id)(ctx, tx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "SELECT pg_sleep(10)")
			return err
		})
		if recorded(t, l.bundle.pool, "billing", id+"-2") {
			t.Errorf("%s-2 recorded", id)
		}
		return err
	}, isCanceled},

	{"claim-in-caller-tx-waiting", func(ctx context.Context, cancel func(), l *leakBundle, t *testing.T, id string) error {
		defer pgtest.HoldClaim(t, l.bundle.pool, l.bundle.store, id).Rollback(context.Background()) //nolint:errcheck
		l.cancelWhen(t, "%INSERT INTO%", "transactionid", cancel)
		return l.forTx(ctx, func(tx pgx.Tx) error {
			if _, err := l.store.Claim(ctx, tx, id); err != nil {
				return err
			}
			return charge(id)(ctx, tx)
		})
	}, isCanceled},

	{"claim-batch-in-caller-tx", func(ctx context.Context, cancel func(), l *leakBundle, t *testing.T, id string) error {
		return l.forTx(ctx, func(tx pgx.Tx) error {
			cancel()
			_, err := l.store.ClaimBatch(ctx, tx, []string{id, id + "-2"})
			return err
		})
	}, errIs(context.Canceled)},

	{"cleanup", func(ctx context.Context, cancel func(), l *leakBundle, t *testing.T, id string) error {
		cancel()
		_, err := l.store.Cleanup(ctx)
		return err
	}, errIs(context.Canceled)},

	{"run-cleaner", func(ctx context.Context, cancel func(), l *leakBundle, t *testing.T, id string) error {
		done := make(chan error, 1)
		go func() { done <- l.store.RunCleaner(ctx, 5*time.Millisecond) }()
		time.Sleep(50 * time.Millisecond) // a few runs
		cancel()
		return <-done
	}, errIs(context.Canceled)},
}

// mustNotRun is an fn for stages that end before fn may run.
func mustNotRun(t *testing.T) func(context.Context, pgx.Tx) error {
	return func(context.Context, pgx.Tx) error {
		t.Error("fn ran")
		return nil
	}
}
