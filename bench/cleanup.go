package main

import (
	"context"
	"fmt"
	"time"

	"github.com/pgdedup/pgdedup"
)

// cleanupResult is scenario 7: Cleanup of many expired rows, and what it does
// to the latency of Process running alongside.
type cleanupResult struct {
	rows     int64         // expired rows deleted
	took     time.Duration // Cleanup's wall time
	populate time.Duration // time to insert the expired rows (not part of the result)
	batch    int           // Config.CleanupBatchSize used; 0 for the default
	without  sample        // Process, one worker, before Cleanup
	during   sample        // Process, one worker, while Cleanup runs
}

func (r cleanupResult) rowsPerSec() float64 { return float64(r.rows) / r.took.Seconds() }

// runCleanup inserts cfg.cleanupRows expired rows, measures Process at one
// worker for cfg.cleanupBaseline, then runs Cleanup (batches of
// cfg.cleanupBatch, by default the library's) with Process running alongside
// until Cleanup returns.
//
// The table is ANALYZEd after the bulk insert, as autovacuum would have done
// by the time rows expire in production; autovacuum may be off or not have
// run yet, and the planner should not guess at an empty table.
func (b *bench) runCleanup(ctx context.Context, prog *progress) (cleanupResult, error) {
	var r cleanupResult
	e, err := b.env(ctx, "", "", 2, nil)
	if err != nil {
		return r, err
	}
	defer e.close()
	cleaner, err := pgdedup.New(e.pool, pgdedup.Config{Consumer: consumer, Retention: retention, CleanupBatchSize: b.cfg.cleanupBatch})
	if err != nil {
		return r, err
	}
	r.batch = b.cfg.cleanupBatch

	prog.step("cleanup: inserting %d expired rows", b.cfg.cleanupRows)
	t0 := time.Now()
	_, err = b.admin.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, processed_at, expires_at)
SELECT 'bench-expired', md5(g::text), now() - interval '3 days', now() - interval '1 day' + g * interval '1 millisecond'
FROM generate_series(1, $1::int) g`, b.cfg.cleanupRows)
	if err == nil {
		_, err = b.admin.Exec(ctx, `ANALYZE processed_messages`)
	}
	if err != nil {
		return r, fmt.Errorf("insert expired rows: %w", err)
	}
	r.populate = time.Since(t0)

	process := func(ctx context.Context, _ int) error { return handleProcess(ctx, e, newID()) }
	prog.step("cleanup: Process alone for %s", b.cfg.cleanupBaseline)
	if r.without, err = measure(ctx, 1, b.cfg.cleanupBaseline, nil, process); err != nil {
		return r, fmt.Errorf("process before cleanup: %w", err)
	}

	prog.step("cleanup: Cleanup with Process alongside")
	done := make(chan struct{})
	type outcome struct {
		rows int64
		took time.Duration
		err  error
	}
	cleaned := make(chan outcome, 1)
	go func() {
		defer close(done)
		t0 := time.Now()
		n, err := cleaner.Cleanup(ctx)
		cleaned <- outcome{n, time.Since(t0), err}
	}()
	r.during, err = measure(ctx, 1, time.Hour, done, process)
	c := <-cleaned
	if err != nil {
		return r, fmt.Errorf("process during cleanup: %w", err)
	}
	if c.err != nil {
		return r, fmt.Errorf("cleanup: %w", c.err)
	}
	if c.rows != int64(b.cfg.cleanupRows) {
		return r, fmt.Errorf("cleanup deleted %d rows, want the %d expired ones", c.rows, b.cfg.cleanupRows)
	}
	r.rows, r.took = c.rows, c.took
	return r, nil
}
