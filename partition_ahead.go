package pgdedup

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Creating partitions ahead must never wait behind the rest of a cleanup.
// Sealing waits for open transactions and a detach for old ones, each up to
// seconds, and claims fail once the partitions created ahead run out. So
// RunCleaner on a pool creates them on a loop of its own (createAhead), at its
// interval, beside the runs that seal and drop; and the waits of one run
// are bounded by half a span unless a test sets them (boundedWait), so
// that a Cleanup run alone every span also keeps up.

// createAhead starts creating the partitions ahead every interval (±10%,
// at least every 50 ms)
// while the table is partitioned, until ctx ends or stop is called; stop
// waits for it to end. Only on a pool: a single connection cannot serve
// two goroutines, and then each run's bounded waits alone keep up.
func (s *Store) createAhead(ctx context.Context, interval time.Duration) (stop func()) {
	if _, ok := s.db.(*pgxpool.Pool); !ok {
		return func() {}
	}
	interval = max(interval, MinPartitionSpan/2)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTimer(jitter(interval))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if ls, err := s.layouts(ctx, pgxQueryRow(s.db)); err == nil {
				if _, ok := ls.messages.(partitionedLayout); ok {
					created, err := s.createPartitions(ctx, 0)
					switch {
					case err != nil && ctx.Err() == nil:
						s.log.WarnContext(ctx, "pgdedup: create partitions ahead", "table", s.messages.table, "error", err)
					case len(created) > 0:
						s.log.InfoContext(ctx, "pgdedup: partitions created ahead", "table", s.messages.table, "created", spanNames(created))
					}
				}
			}
			t.Reset(jitter(interval))
		}
	}()
	return func() { cancel(); <-done }
}

// boundedWait is a default wait d of one cleanup step, at most half a span
// (and at least 10 ms).
func boundedWait(d, span time.Duration) time.Duration {
	return min(d, max(span/2, 10*time.Millisecond))
}
