package pgdedup

import (
	"testing"
	"time"
)

// A fleet's cleaners drift apart: each wait is interval ±10%, and not always
// the same.
func TestJitter(t *testing.T) {
	t.Parallel()
	const d = time.Hour
	seen := map[time.Duration]bool{}
	for range 1000 {
		j := jitter(d)
		if j < d*9/10 || j >= d*11/10 {
			t.Fatalf("jitter(%s) = %s, outside ±10%%", d, j)
		}
		seen[j] = true
	}
	if len(seen) < 900 {
		t.Errorf("only %d distinct waits in 1000", len(seen))
	}
	if got := jitter(time.Nanosecond); got != time.Nanosecond {
		t.Errorf("jitter(1ns) = %s", got)
	}
}
