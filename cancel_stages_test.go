package pgdedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

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
			return &pgconn.PgError{Code: "40001", Message: "injected serialization failure"}
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
