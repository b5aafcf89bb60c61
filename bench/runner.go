package main

import (
	"context"
	"slices"
	"sync"
	"time"
)

// sample is one scenario's measurement in one round.
type sample struct {
	ops     int             // operations completed (messages or batches)
	elapsed time.Duration   // wall time of the round
	lat     []time.Duration // latency of each operation, sorted
}

func (s sample) perSec() float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.ops) / s.elapsed.Seconds()
}

// pct returns the q-quantile (0 < q <= 1) of the latencies, nearest rank.
func (s sample) pct(q float64) time.Duration {
	if len(s.lat) == 0 {
		return 0
	}
	i := int(float64(len(s.lat))*q+0.999999) - 1
	return s.lat[min(max(i, 0), len(s.lat)-1)]
}

// measure runs op from workers goroutines until d has passed (or done is
// closed, when not nil) and returns what they did. The first error stops all
// workers and is returned.
func measure(ctx context.Context, workers int, d time.Duration, done <-chan struct{}, op func(ctx context.Context, worker int) error) (sample, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		firstErr error
		all      []time.Duration
		wg       sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, 4096)
			for ctx.Err() == nil {
				t0 := time.Now()
				if t0.After(deadline) || closed(done) {
					break
				}
				if err := op(ctx, w); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					cancel()
					break
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	slices.Sort(all)
	return sample{ops: len(all), elapsed: elapsed, lat: all}, firstErr
}

// series is one scenario's samples, one per round.
type series []sample

func (s series) perSec() float64 { return medianOf(s, func(x sample) float64 { return x.perSec() }) }

func (s series) pct(q float64) time.Duration {
	return time.Duration(medianOf(s, func(x sample) float64 { return float64(x.pct(q)) }))
}

// ratio is the median over rounds of s's throughput divided by base's in the
// same round: machine drift between rounds cancels.
func (s series) ratio(base series) float64 { return median(s.ratios(base)) }

// ratios are s's throughput divided by base's, round by round.
func (s series) ratios(base series) []float64 {
	n := min(len(s), len(base))
	rs := make([]float64, 0, n)
	for i := range n {
		if b := base[i].perSec(); b > 0 {
			rs = append(rs, s[i].perSec()/b)
		}
	}
	return rs
}

func medianOf(s series, f func(sample) float64) float64 {
	xs := make([]float64, len(s))
	for i, x := range s {
		xs[i] = f(x)
	}
	return median(xs)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[len(xs)/2]
}

func closed(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}
