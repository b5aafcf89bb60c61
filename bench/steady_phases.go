package main

import (
	"slices"
	"time"
)

// steadyPhases is how many equal parts of the checkpoint cycle the steady
// part reports latency by: the window starts with a CHECKPOINT (and the
// server's checkpoint_timeout counts from it), so the first part holds the
// claims that wrote each page's first image after it.
const steadyPhases = 10

// phaseStat is the latencies of the Process calls that ended in one phase of
// the checkpoint cycle, over all the cycles of a window.
type phaseStat struct {
	n         int           // calls
	p50, p99  time.Duration // of Process alone
	p99Queued time.Duration // p99 from the message's entry into the queue: its wait for a worker, then Process
}

// cyclePhases buckets the calls that ended in [from, to) by phase of a cycle
// that starts at from: phases equal parts of cycle, counted again each
// cycle. lat[i] is a call's duration, queued[i] its time from the message's
// entry into the workers' queue to its end, and at[i] when it ended (since
// the start of the load). Each phase gets its count, p50 and p99 of lat, and
// p99 of queued.
func cyclePhases(lat, queued, at []time.Duration, from, to, cycle time.Duration, phases int) []phaseStat {
	byLat := make([][]time.Duration, phases)
	byQueued := make([][]time.Duration, phases)
	for i, t := range at {
		if t < from || t >= to {
			continue
		}
		k := int((t - from) % cycle * time.Duration(phases) / cycle)
		byLat[k] = append(byLat[k], lat[i])
		byQueued[k] = append(byQueued[k], queued[i])
	}
	out := make([]phaseStat, phases)
	for k := range out {
		slices.Sort(byLat[k])
		slices.Sort(byQueued[k])
		s, d := sample{lat: byLat[k]}, sample{lat: byQueued[k]}
		out[k] = phaseStat{n: len(byLat[k]), p50: s.pct(0.5), p99: s.pct(0.99), p99Queued: d.pct(0.99)}
	}
	return out
}

// worstP99 is the highest p99 of ps, 0 when ps is empty.
func worstP99(ps []phaseStat) time.Duration {
	var w time.Duration
	for _, p := range ps {
		w = max(w, p.p99)
	}
	return w
}
