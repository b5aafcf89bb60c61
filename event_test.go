package pgdedup_test

import (
	"testing"

	"github.com/pgdedup/pgdedup"
)

// Each kind has the short name metrics use as a label; others are "unknown".
func TestEventKindString(t *testing.T) {
	t.Parallel()
	for kind, want := range map[pgdedup.EventKind]string{
		pgdedup.EventProcessed:       "processed",
		pgdedup.EventDuplicate:       "duplicate",
		pgdedup.EventRetry:           "retry",
		pgdedup.EventInFlight:        "in_flight",
		pgdedup.EventCleanup:         "cleanup",
		pgdedup.EventPayloadMismatch: "payload_mismatch",
		0:                            "unknown",
		99:                           "unknown",
	} {
		if got := kind.String(); got != want {
			t.Errorf("EventKind(%d).String() = %q, want %q", kind, got, want)
		}
	}
}
