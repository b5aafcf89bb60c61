package pgdedup

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// cleanupCitus is Cleanup on a table Citus manages, where the plain batch
// (rows picked by ctid, or any DELETE whose rows come from an ORDER BY …
// LIMIT subquery) is refused or pulled through the coordinator. It deletes by
// windows of expires_at instead: DELETE … WHERE expires_at >= $1 AND
// expires_at < $2 AND expires_at < now() is one statement that every shard runs
// in parallel over its own expires_at index, and the coordinator evaluates
// now() once, so no unexpired row is ever deleted.
//
// A batch stays bounded by counting the window first (in the same transaction)
// and deleting only when it holds at most Config.CleanupBatchSize rows;
// otherwise the window shrinks and is counted again. The window adapts to the
// density of expiries, aiming at 3/4 of the batch size. The only batch that can
// exceed the size is one of more rows than that sharing one microsecond of
// expires_at (a single huge ClaimBatch): they are deleted together.
//
// Cleaners take turns as on plain PostgreSQL: each batch's transaction first
// tries the transaction-scoped advisory lock on the coordinator, so every
// cleaner must connect through the coordinator, as all of pgdedup does.
func (s *Store) cleanupCitus(ctx context.Context) (deleted int64, skipped bool, err error) {
	t := s.messages.table
	batch := int64(s.cfg.CleanupBatchSize)
	var from, now time.Time
	var empty bool
	err = s.db.QueryRow(ctx, `SELECT coalesce(min(expires_at), now()), now(), min(expires_at) IS NULL FROM `+t+
		` WHERE expires_at < now()`).Scan(&from, &now, &empty)
	if err != nil || empty {
		return 0, false, s.cleanupError(ctx, err)
	}
	width := time.Second // grows or shrinks with the density of expiries
	hadTurn := false
	for !from.After(now) {
		if err := ctx.Err(); err != nil {
			return deleted, false, err
		}
		t0 := time.Now()
		to := from.Add(width)
		n, counted, turn, err := s.cleanupWindow(ctx, from, to, batch, width <= time.Microsecond)
		if err != nil {
			return deleted, false, s.cleanupError(ctx, err)
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
			if err := s.db.QueryRow(ctx, `SELECT min(expires_at) FROM `+t+` WHERE expires_at >= $1 AND expires_at < now()`, to).Scan(&next); err != nil {
				return deleted, false, s.cleanupError(ctx, err)
			}
			if next == nil {
				return deleted, false, nil
			}
			from = *next
			continue
		}
		s.log.DebugContext(ctx, "pgdedup: cleanup batch", "deleted", n, "duration", time.Since(t0))
		from = to
		if counted < batch/2 {
			width = time.Duration(float64(width) * min(16, 0.75*float64(batch)/float64(counted)))
		}
	}
	return deleted, false, nil
}

// cleanupWindow runs one batch: in one transaction, it tries the cleaners'
// advisory lock (turn is false when another cleaner holds it), counts the
// expired rows with expires_at in [from, to) and deletes them if there are at
// most batch of them or force is set.
func (s *Store) cleanupWindow(ctx context.Context, from, to time.Time, batch int64, force bool) (deleted, counted int64, turn bool, err error) {
	t := s.messages.table
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	// One connection per worker (the workers in parallel, each worker's shards
	// one after another): the coordinator keeps one connection per worker open
	// between transactions and would otherwise open more for each batch, which
	// costs more than the shards' work.
	b.Queue(citusCleanerMark + `SELECT pg_try_advisory_xact_lock(` + cleanupLockClass + `, '` + t + `'::regclass::oid::int4),
set_config('citus.max_adaptive_executor_pool_size', '1', true)`)
	b.Queue(citusCleanerMark+`SELECT count(*) FROM `+t+` WHERE expires_at >= $1 AND expires_at < $2 AND expires_at < now()`, from, to)
	br := s.db.SendBatch(ctx, b)
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
	tag, err := tx.Exec(ctx, citusCleanerMark+`DELETE FROM `+t+` WHERE expires_at >= $1 AND expires_at < $2 AND expires_at < now()`, from, to)
	if err != nil {
		return 0, counted, turn, err
	}
	return tag.RowsAffected(), counted, turn, tx.Commit(ctx)
}

// citusCleanerMark begins each statement of a Citus cleaner's window, so that
// a Cleanup waiting for the turn sees in pg_stat_activity that its holder is
// a cleaner at work (see sightTurn), as the plain batch's statements show by
// naming cleanupTurnSetting: a window on a loaded cluster may take longer
// than Config.CleanupTurnWait.
const citusCleanerMark = "/* " + cleanupTurnSetting + " */ "

// cleanupError returns ctx's error when ctx is done (a stopped Cleanup is
// not a failure), else err with the table named and the server's DETAIL kept.
func (s *Store) cleanupError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	return fmt.Errorf("pgdedup: cleanup of %s: %w", s.messages.table, withDetail(err))
}
