package pgdedup

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Cleanup deletes the rows whose expires_at has passed, of every consumer in
// the table (not only the Store's), and returns how many it deleted. It never
// deletes a row that has not expired, so an ID stays a duplicate for its whole
// Retention. One cleaner per database is enough.
//
// It deletes in transactions of at most Config.CleanupBatchSize rows, each
// committed on its own, until a batch comes back short: no lock is held for
// long, the WAL is written in small pieces, and an interrupted Cleanup keeps
// the batches it committed. ctx is checked between batches and also cancels
// the batch in flight: Cleanup then returns ctx.Err() and the rows deleted by
// the batches it saw commit (the batch it interrupted may have committed too).
// Rows committed late by a long transaction with an expires_at behind the
// run's progress are left to the next run.
//
// Cleanup is safe to run from many processes at once: cleaners of a table take
// turns through a transaction-scoped advisory lock tried once per batch, so
// they never wait for each other or deadlock, and a Cleanup that finds another
// cleaner at work returns and leaves the rest to it. It never waits on a claim.
// It holds no session state, so it works behind PgBouncer in transaction
// pooling mode, and needs only SELECT and DELETE on the table.
//
// Each run is logged (info: rows deleted and duration; each batch at debug
// level) and reported to Config.OnEvent as an EventCleanup.
func (s *Store) Cleanup(ctx context.Context) (deleted int64, err error) {
	start := time.Now()
	defer func() { s.cleanupDone(ctx, deleted, time.Since(start), err) }()
	l, err := s.layout(ctx, pgxQueryRow(s.db))
	if err != nil {
		return 0, s.cleanupError(ctx, err)
	}
	if l.citus {
		return s.cleanupCitus(ctx)
	}
	sql := s.cleanupSQL()
	batch := int64(s.cfg.CleanupBatchSize)
	from := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	for {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		t0 := time.Now()
		var n int64
		err := s.db.QueryRow(ctx, sql, batch, from).Scan(&n, &from)
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return deleted, ctxErr
			}
			return deleted, fmt.Errorf("pgdedup: cleanup of %s: %w", s.sql.table, withDetail(err))
		}
		deleted += n
		s.log.DebugContext(ctx, "pgdedup: cleanup batch", "deleted", n, "duration", time.Since(t0))
		if n < batch {
			return deleted, nil
		}
	}
}

// cleanupSQL deletes one batch, as one statement and so one transaction: the
// oldest expired rows from expires_at $2 on. It returns how many it deleted and
// the latest expires_at among them, where the next batch starts, so that no
// batch walks again over the index entries of the rows deleted before it: until
// vacuum removes them (and it cannot while any older transaction is open) every
// scan from the start of the index would visit them all, and a long Cleanup
// would slow down batch after batch.
//
// Concurrent cleaners take turns through a transaction-scoped advisory lock
// (keyed by the table's OID), tried once per batch: a batch that does not
// get it deletes nothing, and its Cleanup leaves the rest to the cleaner at work.
// So cleaners never wait for each other, the lock ends with each batch's
// transaction (PgBouncer-safe), and, unlike FOR UPDATE SKIP LOCKED, no UPDATE
// privilege is needed: SELECT and DELETE are enough. Claims never wait on a
// cleaner except for an expired ID redelivered while its row is being deleted,
// and a cleaner never waits on a claim (ON CONFLICT DO NOTHING locks nothing).
//
// The rows are found through the expires_at index and deleted by ctid (a TID
// scan, no second index lookup); the DELETE checks expires_at again.
func (s *Store) cleanupSQL() string {
	t := s.sql.table
	return `WITH deleted AS (
DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(
SELECT ctid FROM ` + t + ` WHERE expires_at < now() AND expires_at >= $2
ORDER BY expires_at LIMIT $1))
AND expires_at < now()
AND (SELECT pg_try_advisory_xact_lock(` + cleanupLockClass + `, '` + t + `'::regclass::oid::int4))
RETURNING expires_at)
SELECT count(*), coalesce(max(expires_at), $2) FROM deleted`
}

// cleanupLockClass is the first half of the cleaners' advisory lock key ("pgdd"
// in ASCII); the second is the table's OID, so cleaners of different tables, or
// of same-named tables in different schemas, never take turns.
const cleanupLockClass = "1885824100"

// cleanupDone logs and reports one Cleanup run. A run stopped by its context
// (a service shutting down) is not a failure worth a warning.
func (s *Store) cleanupDone(ctx context.Context, deleted int64, d time.Duration, err error) {
	switch {
	case err == nil:
		s.log.InfoContext(ctx, "pgdedup: cleanup", "table", s.sql.table, "deleted", deleted, "duration", d)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		s.log.InfoContext(ctx, "pgdedup: cleanup stopped", "table", s.sql.table, "deleted", deleted, "duration", d, "error", err)
	default:
		s.log.WarnContext(ctx, "pgdedup: cleanup failed", "table", s.sql.table, "deleted", deleted, "duration", d, "error", err)
	}
	s.emit(ctx, Event{Kind: EventCleanup, Count: deleted, Duration: d, Err: err})
}

// RunCleaner runs Cleanup about every interval until ctx is done, then returns
// ctx.Err(); it blocks, so start it in a goroutine of its own and cancel ctx to
// stop it. It starts no goroutine itself.
//
// The first run comes after a random delay of up to one interval, and each wait
// after a run is interval ±10%, so a fleet of services started together does
// not clean in step. A failed run is logged (Config.Logger) and reported
// (Config.OnEvent) and the next one comes at the next tick: a database outage
// does not end the loop. Run it in every instance, or in one: concurrent
// cleaners are safe and skip each other's rows.
//
// Pick interval well below Retention (an hour is a good start); a cleanup that
// finds nothing to delete costs one index probe.
func (s *Store) RunCleaner(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("pgdedup: RunCleaner interval must be positive, got %s", interval)
	}
	t := time.NewTimer(rand.N(interval) + 1)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		_, _ = s.Cleanup(ctx) // logged and reported by Cleanup
		t.Reset(jitter(interval))
	}
}

// jitter returns d ±10%, uniformly.
func jitter(d time.Duration) time.Duration {
	spread := d / 5
	if spread <= 0 {
		return d
	}
	return d - spread/2 + rand.N(spread)
}
