package pgdedup

import (
	"time"
)

// EventKind says what an [Event] reports.
type EventKind int

// The outcomes reported to Config.OnEvent.
const (
	// EventProcessed occurs when fn committed for Count new message IDs (1
	// for [Store.Process]).
	EventProcessed EventKind = iota + 1
	// EventDuplicate occurs when Count IDs were already recorded and skipped.
	EventDuplicate
	// EventRetry occurs when attempt number Attempt failed with the transient
	// Err and is retried.
	EventRetry
	// EventInFlight occurs when another transaction held an ID past
	// Config.LockTimeout. The Count messages of the call (1, or the batch's
	// distinct IDs) were not processed.
	EventInFlight
	// EventCleanup occurs when a Cleanup run deleted Count expired rows in
	// Duration, or failed with Err. On a [LayoutPartitioned] table, Created
	// and Dropped list the partitions it created and dropped.
	EventCleanup
	// EventPayloadMismatch occurs when a delivery with [WithFingerprint] found
	// its ID recorded with another fingerprint. Err is the
	// *[PayloadMismatchError].
	EventPayloadMismatch
)

var eventKindNames = [...]string{"", "processed", "duplicate", "retry", "in_flight", "cleanup", "payload_mismatch"}

// String returns a short lower-case name, suitable as a metric label.
func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventKindNames) {
		return eventKindNames[k]
	}
	return "unknown"
}

// Event is one outcome reported to [Config.OnEvent].
type Event struct {
	Kind      EventKind
	Consumer  string
	MessageID string        // the ID of a single-message event, empty for batches and cleanup
	Count     int64         // IDs processed, skipped or given up on (in flight), or rows deleted
	Attempt   int           // the attempt that failed, from 1, for EventRetry
	Duration  time.Duration // the time taken, for EventProcessed and EventCleanup
	Err       error         // for EventRetry, EventCleanup and EventPayloadMismatch

	// Created and Dropped are, for EventCleanup on a [LayoutPartitioned]
	// table, the partitions the run created and those it dropped, oldest
	// first. Count is then PostgreSQL's estimate of the rows they held. Once
	// the run reached the partitions they are not nil, but may be empty. Both
	// are nil on a plain table.
	Created, Dropped []PartitionSpan
}

// PartitionSpan is one partition of a [LayoutPartitioned] table that a Cleanup
// created or dropped ([Event]). It holds the claims From ≤ processed_at < To.
type PartitionSpan struct {
	Name string    `json:"name"` // in the table's schema
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
}
