package pgdedup

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// Cleanup deletes the rows of every consumer whose expires_at has passed, in
// transactions of at most Config.CleanupBatchSize rows each, until none is
// left, and returns how many it deleted. It never deletes a row that has not
// expired. Each batch commits on its own, so an interrupted Cleanup keeps its
// progress; ctx is checked between batches.
//
// Cleanup is safe to run from many processes at once: each batch locks its rows
// with FOR UPDATE SKIP LOCKED, so cleaners skip each other's rows instead of
// waiting or deadlocking. It holds no session state and works behind PgBouncer
// in transaction pooling mode.
func (s *Store) Cleanup(ctx context.Context) (deleted int64, err error) {
	start := time.Now()
	defer func() {
		d := time.Since(start)
		if err != nil {
			s.log.WarnContext(ctx, "pgdedup: cleanup failed", "deleted", deleted, "duration", d, "error", err)
		} else {
			s.log.InfoContext(ctx, "pgdedup: cleanup", "deleted", deleted, "duration", d)
		}
		s.emit(ctx, Event{Kind: EventCleanup, Count: deleted, Duration: d, Err: err})
	}()
	sql := s.cleanupSQL()
	for {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		tag, err := s.db.Exec(ctx, sql, s.cfg.CleanupBatchSize)
		if err != nil {
			return deleted, fmt.Errorf("pgdedup: cleanup: %w", err)
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < int64(s.cfg.CleanupBatchSize) {
			return deleted, nil
		}
	}
}

// cleanupSQL deletes one batch: the oldest expired rows that no other
// transaction has locked. A single statement is its own transaction.
func (s *Store) cleanupSQL() string {
	t := s.sql.table
	return `DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(
SELECT ctid FROM ` + t + ` WHERE expires_at < now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED))`
}

// RunCleaner runs Cleanup every interval (each wait jittered by ±10% so a fleet
// of cleaners drifts apart) until ctx is done, then returns ctx.Err(). A failed
// run is logged and tried again at the next tick. The first run starts after
// one interval.
func (s *Store) RunCleaner(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("pgdedup: RunCleaner interval must be positive, got %s", interval)
	}
	t := time.NewTimer(jitter(interval))
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

func jitter(d time.Duration) time.Duration {
	spread := d / 5
	if spread <= 0 {
		return d
	}
	return d - spread/2 + rand.N(spread)
}
