package citus

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// cleanup is Cleanup on a plain table that Citus manages. The plain batch
// picks rows by ctid, or by an ORDER BY … LIMIT subquery. Citus refuses it
// or pulls it through the coordinator. So cleanup deletes by windows of
// expires_at instead. DELETE … WHERE expires_at >= $1 AND expires_at < $2
// AND expires_at < now() is one statement that every shard runs in
// parallel over its own expires_at index. The coordinator evaluates now()
// once, so no unexpired row is ever deleted.
//
// A batch stays bounded because the window is counted first, in the same
// transaction. It is deleted only when it holds at most
// Config.CleanupBatchSize rows. Otherwise the window shrinks and is counted
// again. The window adapts to the density of expiries, aiming at 3/4 of the
// batch size. Only one batch can exceed the size. It holds more rows than
// that sharing one microsecond of expires_at, from a single huge
// ClaimBatch. They are deleted together.
//
// Cleaners take turns as on plain PostgreSQL. Each batch's transaction
// first tries the transaction-scoped advisory lock on the coordinator. So
// every cleaner must connect through the coordinator, as all of pgdedup
// does.
func cleanup(ctx context.Context, env shape.Env) (deleted int64, skipped bool, err error) {
	t := env.Table
	batch := env.CleanupBatchSize
	var from, now time.Time
	var empty bool
	err = env.DB.QueryRow(ctx, `SELECT coalesce(min(expires_at), now()), now(), min(expires_at) IS NULL FROM `+t+
		` WHERE expires_at < now()`).Scan(&from, &now, &empty)
	if err != nil || empty {
		return 0, false, cleanupError(ctx, t, err)
	}
	width := time.Second // grows or shrinks with the density of expiries
	hadTurn := false
	for !from.After(now) {
		if err := ctx.Err(); err != nil {
			return deleted, false, err
		}
		t0 := time.Now()
		to := from.Add(width)
		n, counted, turn, err := cleanupWindow(ctx, env.DB, t, from, to, batch, width <= time.Microsecond)
		if err != nil {
			return deleted, false, cleanupError(ctx, t, err)
		}
		if !turn {
			return deleted, !hadTurn, nil // another cleaner is at work
		}
		hadTurn = true
		deleted += n
		if counted > batch && width > time.Microsecond {
			width = max(time.Microsecond, time.Duration(float64(width)*0.75*float64(batch)/float64(counted)))
			continue
		}
		if counted == 0 { // a gap: go on from the next expired row, if any
			var next *time.Time
			if err := env.DB.QueryRow(ctx, `SELECT min(expires_at) FROM `+t+` WHERE expires_at >= $1 AND expires_at < now()`, to).Scan(&next); err != nil {
				return deleted, false, cleanupError(ctx, t, err)
			}
			if next == nil {
				return deleted, false, nil
			}
			from = *next
			continue
		}
		env.Log.DebugContext(ctx, "pgdedup: cleanup batch", "deleted", n, "duration", time.Since(t0))
		from = to
		if counted < batch/2 {
			width = time.Duration(float64(width) * min(16, 0.75*float64(batch)/float64(counted)))
		}
	}
	return deleted, false, nil
}

// cleanupWindow runs one batch in one transaction. It tries the cleaners'
// advisory lock, and turn is false when another cleaner holds it. It counts
// the expired rows with expires_at in [from, to). It deletes them if there
// are at most batch of them, or if force is set.
func cleanupWindow(ctx context.Context, db shape.DB, t string, from, to time.Time, batch int64, force bool) (deleted, counted int64, turn bool, err error) {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	// The pool size of 1 means one connection per worker. The workers work
	// in parallel, and each worker's shards one after another. The coordinator keeps one
	// connection per worker open between transactions. It would otherwise
	// open more for each batch, which costs more than the shards' work.
	b.Queue(cleanerMark + `SELECT pg_try_advisory_xact_lock(` + shape.CleanupLockClass + `, '` + t + `'::regclass::oid::int4),
set_config('citus.max_adaptive_executor_pool_size', '1', true)`)
	b.Queue(cleanerMark+`SELECT count(*) FROM `+t+` WHERE expires_at >= $1 AND expires_at < $2 AND expires_at < now()`, from, to)
	br := db.SendBatch(ctx, b)
	tx := br.Tx()
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	_, err = br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&turn, nil)
	}
	if err == nil {
		err = br.QueryRow().Scan(&counted)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil || !turn || counted == 0 || counted > batch && !force {
		return 0, counted, turn, err
	}
	tag, err := tx.Exec(ctx, cleanerMark+`DELETE FROM `+t+` WHERE expires_at >= $1 AND expires_at < $2 AND expires_at < now()`, from, to)
	if err != nil {
		return 0, counted, turn, err
	}
	return tag.RowsAffected(), counted, turn, tx.Commit(ctx)
}

// cleanerMark begins each statement of a cleaner's window. A Cleanup
// waiting for the turn then sees in pg_stat_activity that its holder is a
// cleaner at work (see plain.SightTurn). The plain batch's statements show
// it by naming the turn setting. A window on a loaded cluster may take
// longer than Config.CleanupTurnWait.
const cleanerMark = "/* " + shape.CleanupTurnSetting + " */ "

// cleanupError returns ctx's error when ctx is done, because a stopped
// Cleanup is not a failure. Otherwise it returns err with the table named
// and the server's DETAIL kept.
func cleanupError(ctx context.Context, table string, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	return fmt.Errorf("pgdedup: cleanup of %s: %w", table, shape.WithDetail(err))
}
