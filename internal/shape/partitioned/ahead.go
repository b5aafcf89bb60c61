package partitioned

import (
	"context"
	"time"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// Creating partitions ahead must never wait behind the rest of a cleanup.
// Sealing waits for open transactions, and a detach for old ones, each up
// to seconds. Claims fail once the partitions created ahead run out. So
// RunCleaner on a pool creates them on a loop of its own (CreateAhead), at
// its interval, beside the runs that seal and drop. And the waits of one
// run are bounded by half a span unless a test sets them (boundedWait). So
// a Cleanup run alone every span also keeps up.

// CreateAhead starts creating the partitions ahead every interval (±10%)
// until ctx ends or stop is called. stop waits for
// it to end. current returns the table's shape as now found, nil unless it
// is partitioned. Call it only on a pool. A single connection cannot serve
// two goroutines, and then each run's bounded waits alone keep up.
func CreateAhead(ctx context.Context, interval time.Duration, current func(ctx context.Context) *Shape) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTimer(shape.Jitter(interval))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if l := current(ctx); l != nil {
				created, err := l.createPartitions(ctx, 0, 0)
				switch {
				case err != nil && ctx.Err() == nil:
					l.log.WarnContext(ctx, "pgdedup: create partitions ahead", "table", l.table, "error", err)
				case len(created) > 0:
					l.log.InfoContext(ctx, "pgdedup: partitions created ahead", "table", l.table, "created", spanNames(created))
				}
			}
			t.Reset(shape.Jitter(interval))
		}
	}()
	return func() { cancel(); <-done }
}

// boundedWait is a default wait d of one cleanup step, at most half a span
// (and at least 10 ms).
func boundedWait(d, span time.Duration) time.Duration {
	return min(d, max(span/2, 10*time.Millisecond))
}
