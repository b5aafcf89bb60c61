package partitioned

import (
	"testing"
	"time"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// The runway runs to the end of the unbroken partitions that hold now: a
// gap, or a partition being detached, ends it.
func TestRunwayLeft(t *testing.T) {
	now := time.Date(2026, 12, 4, 10, 30, 0, 0, time.UTC)
	h := func(n int) time.Time { return time.Date(2026, 12, 4, n, 0, 0, 0, time.UTC) }
	parts := []shape.PartitionSize{{From: h(9), To: h(10)}, {From: h(10), To: h(11)}, {From: h(11), To: h(12)}, {From: h(13), To: h(14)}}
	if got := runwayLeft(parts, now); got != 90*time.Minute {
		t.Errorf("runway with a gap at 12:00 = %s, want 1h30m", got)
	}
	parts[2].Detaching = true
	if got := runwayLeft(parts, now); got != 30*time.Minute {
		t.Errorf("runway with 11:00 detaching = %s, want 30m", got)
	}
	if got := runwayLeft(parts[3:], now); got != 0 {
		t.Errorf("runway with no partition for now = %s, want 0", got)
	}
}

// The partitions ahead cover the runway, at least Ahead and at most
// MaxAhead.
func TestAheadFor(t *testing.T) {
	for _, c := range []struct {
		runway, span time.Duration
		want         int
	}{
		{48 * time.Hour, 4 * time.Hour, 12},
		{49 * time.Hour, 4 * time.Hour, 13},
		{time.Millisecond, 2 * time.Second, Ahead},
		{48 * time.Hour, 2 * time.Second, MaxAhead},
		{time.Hour, 0, Ahead},
	} {
		if got := AheadFor(c.runway, c.span); got != c.want {
			t.Errorf("AheadFor(%s, %s) = %d, want %d", c.runway, c.span, got, c.want)
		}
	}
}
