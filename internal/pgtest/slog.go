package pgtest

import (
	"context"
	"log/slog"
	"sync"
)

// LogCapture is a slog.Handler that keeps every record, for tests that check
// what a Store logged: slog.New(&pgtest.LogCapture{}). Its zero value is
// ready; it is safe for concurrent use.
type LogCapture struct {
	// OnRecord, when set, is called with each record as it is logged.
	OnRecord func(slog.Record)

	mu      sync.Mutex
	records []slog.Record
}

// Enabled is true for every level.
func (h *LogCapture) Enabled(context.Context, slog.Level) bool { return true }

// WithAttrs returns h: attributes given to Logger.With are not kept.
func (h *LogCapture) WithAttrs([]slog.Attr) slog.Handler { return h }

// WithGroup returns h.
func (h *LogCapture) WithGroup(string) slog.Handler { return h }

// Handle keeps r and passes it to OnRecord.
func (h *LogCapture) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.records = append(h.records, r.Clone())
	on := h.OnRecord
	h.mu.Unlock()
	if on != nil {
		on(r)
	}
	return nil
}

// Records returns the records with message msg, in the order logged.
func (h *LogCapture) Records(msg string) []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range h.records {
		if r.Message == msg {
			out = append(out, r)
		}
	}
	return out
}

// Last returns the last record with message msg, or nil.
func (h *LogCapture) Last(msg string) *slog.Record {
	rs := h.Records(msg)
	if len(rs) == 0 {
		return nil
	}
	return &rs[len(rs)-1]
}

// Attr returns the value of r's attribute key, and whether it has one.
func Attr(r slog.Record, key string) (slog.Value, bool) {
	var v slog.Value
	found := false
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v, found = a.Value, true
		}
		return true
	})
	return v, found
}
