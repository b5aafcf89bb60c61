package pgdedup_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

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
