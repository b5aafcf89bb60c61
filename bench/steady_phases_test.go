package main

import (
	"slices"
	"testing"
	"time"
)

// Each call falls in the tenth of its cycle it ended in, cycle after cycle;
// calls outside the window are left out; each tenth has its count, p50, p99
// and queued p99.
func TestCyclePhases(t *testing.T) {
	const cycle = 10 * time.Second
	from, to := time.Second, 21*time.Second // two cycles
	var lat, queued, at []time.Duration
	add := func(end, d, q time.Duration) {
		at, lat, queued = append(at, end), append(lat, d), append(queued, q)
	}
	add(500*time.Millisecond, time.Hour, time.Hour) // before the window
	add(21*time.Second, time.Hour, time.Hour)       // at its end: out
	// The first tenth of each cycle: 100 calls of 1 ms but one of 50 ms,
	// and 100 more in the second cycle, one of 60 ms.
	for c := range 2 {
		start := from + time.Duration(c)*cycle
		for i := range 100 {
			d := time.Millisecond
			if i == 42 {
				d = time.Duration(50+10*c) * time.Millisecond
			}
			add(start+time.Duration(i)*time.Millisecond, d, d+2*time.Millisecond)
		}
	}
	// The last tenth, at its very end: 1 call of 3 ms.
	add(from+cycle-time.Nanosecond, 3*time.Millisecond, 30*time.Millisecond)
	// The sixth tenth (50-60%), at its start, in the second cycle.
	add(from+cycle+cycle/2, 7*time.Millisecond, 7*time.Millisecond)

	got := cyclePhases(lat, queued, at, from, to, cycle, 10)
	if len(got) != 10 {
		t.Fatalf("%d phases, want 10", len(got))
	}
	counts := make([]int, 10)
	for k, p := range got {
		counts[k] = p.n
	}
	if want := []int{200, 0, 0, 0, 0, 1, 0, 0, 0, 1}; !slices.Equal(counts, want) {
		t.Errorf("calls by tenth = %v, want %v", counts, want)
	}
	// 200 calls: the p99 is the 198th smallest, 1 ms; the two slow ones are
	// the 199th and 200th.
	first := got[0]
	if first.p50 != time.Millisecond || first.p99 != time.Millisecond || first.p99Queued != 3*time.Millisecond {
		t.Errorf("first tenth: %+v; want p50 1ms, p99 1ms, queued p99 3ms", first)
	}
	if got[9].p99 != 3*time.Millisecond || got[9].p99Queued != 30*time.Millisecond || got[5].p99 != 7*time.Millisecond {
		t.Errorf("last tenth %+v, sixth %+v; want p99 3ms (queued 30ms), 7ms", got[9], got[5])
	}
	if got[1] != (phaseStat{}) {
		t.Errorf("an empty tenth: %+v, want zeros", got[1])
	}
	if w := worstP99(got); w != 7*time.Millisecond {
		t.Errorf("worst p99 %s, want 7ms", w)
	}

	// With 1% of the first tenth slow, the p99 shows them.
	lat[2+42], lat[2+100+42] = 50*time.Millisecond, 60*time.Millisecond
	lat[2+7] = 55 * time.Millisecond
	if p := cyclePhases(lat, queued, at, from, to, cycle, 10)[0]; p.p99 != 50*time.Millisecond {
		t.Errorf("first tenth with 3 slow calls of 200: p99 %s, want 50ms (the 198th)", p.p99)
	}
}
