package pgdedup_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup/internal/pgtest"

	"github.com/pgdedup/pgdedup"
)

// seed inserts n rows for consumer, IDs seedID(prefix, 1) … seedID(prefix, n),
// in one statement. They expire about expiresIn from now (negative: already
// expired), a microsecond apart and at most expiresIn, so that the order
// Cleanup takes them in is not arbitrary. IDs and expiry both ascend, which
// keeps the inserts at the right edge of both indexes, and the seeding fast.
func seed(t testing.TB, pool *pgxpool.Pool, consumer, prefix string, n int, expiresIn time.Duration) {
	t.Helper()
	mustExec(t, pool, `INSERT INTO processed_messages (consumer, message_id, processed_at, expires_at)
SELECT $1, $2 || lpad(g::text, 7, '0'), now() - interval '2 days', now() + ($4::bigint - $3 + g) * interval '1 microsecond'
FROM generate_series(1, $3::int) g`, consumer, prefix, n, expiresIn.Microseconds())
}

// seedID is the i-th message ID seed inserts with prefix.
func seedID(prefix string, i int) string { return fmt.Sprintf("%s%07d", prefix, i) }

// logSink is a slog.Handler that keeps every record, and calls onBatch, when
// set, for each cleanup batch logged.
type logSink struct {
	mu      sync.Mutex
	records []slog.Record
	onBatch func(deleted int64)
}

func (h *logSink) Enabled(context.Context, slog.Level) bool { return true }
func (h *logSink) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logSink) WithGroup(string) slog.Handler            { return h }

func (h *logSink) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.records = append(h.records, r.Clone())
	on := h.onBatch
	h.mu.Unlock()
	if on != nil && r.Message == "pgdedup: cleanup batch" {
		on(batchDeleted(r))
	}
	return nil
}

// batches returns the rows deleted by each cleanup batch logged, in order.
func (h *logSink) batches() []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []int64
	for _, r := range h.records {
		if r.Message == "pgdedup: cleanup batch" {
			out = append(out, batchDeleted(r))
		}
	}
	return out
}

// batchDurations returns how long each cleanup batch took, in order.
func (h *logSink) batchDurations() []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []time.Duration
	for _, r := range h.records {
		if r.Message == "pgdedup: cleanup batch" {
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "duration" {
					out = append(out, a.Value.Duration())
				}
				return true
			})
		}
	}
	return out
}

// find returns the last record with message msg, or nil.
func (h *logSink) find(msg string) *slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := len(h.records) - 1; i >= 0; i-- {
		if h.records[i].Message == msg {
			return &h.records[i]
		}
	}
	return nil
}

func batchDeleted(r slog.Record) int64 {
	var n int64
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "deleted" {
			n = a.Value.Int64()
		}
		return true
	})
	return n
}

// attr returns the value of r's attribute key as text, or "".
func attr(r slog.Record, key string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
		}
		return true
	})
	return v
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
