package pgdedup

import (
	"testing"

	"github.com/pgdedup/pgdedup/internal/engine"
)

// The engine's event kinds become the root's by value, so each must equal
// the root kind of the same name.
func TestEngineEventKindsAreTheRootKinds(t *testing.T) {
	t.Parallel()
	for ek, k := range map[engine.EventKind]EventKind{
		engine.EventProcessed: EventProcessed, engine.EventDuplicate: EventDuplicate, engine.EventRetry: EventRetry,
		engine.EventInFlight: EventInFlight, engine.EventPayloadMismatch: EventPayloadMismatch,
	} {
		if EventKind(ek) != k {
			t.Errorf("engine kind %d becomes %s, want %s", ek, EventKind(ek), k)
		}
	}
}
