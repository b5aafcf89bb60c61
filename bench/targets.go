package main

import (
	"fmt"
	"slices"
	"strings"
)

// target is one goal of the benchmark issue, checked against this run.
type target struct {
	name, goal, measured string
	met                  bool
}

// targets checks the goals that the parts of this run can answer. Ratio goals
// are stated for 1 and 8 workers; other worker counts are not judged.
func (r *report) targets() []target {
	var ts []target
	ratio := func(name string, t *msgTable, workers int, a, b scenario, goal float64) {
		res, ok := t.results[workers]
		if !ok {
			return
		}
		rs := res[a.key].ratios(res[b.key])
		if len(rs) == 0 {
			return
		}
		x := median(rs)
		ts = append(ts, target{
			name:     fmt.Sprintf("%s, %s, %s", name, t.network, strings.TrimSuffix(workersLabel(workers), ":")),
			goal:     fmt.Sprintf("≥ %.2f×", goal),
			measured: fmt.Sprintf("%.3f× (rounds: %.2f–%.2f)", x, slices.Min(rs), slices.Max(rs)),
			met:      x >= goal,
		})
	}
	for _, t := range r.tables {
		if t.delayed {
			ratio("Process ÷ Redis recipe", t, 1, processTx, redisTx, 1.25)
			continue
		}
		for _, w := range r.cfg.workers {
			ratio("Process ÷ hand-written pipeline", t, w, processTx, pipelineTx, 0.97)
		}
		ratio("Process ÷ bare tx", t, 1, processTx, bareTx, 0.92)
		ratio("Process ÷ bare tx", t, 8, processTx, bareTx, 0.82)
		ratio("Process ÷ Redis recipe", t, 1, processTx, redisTx, 1.15)
		ratio("Process ÷ Redis recipe", t, 8, processTx, redisTx, 0.95)
	}
	if c := r.costs; c != nil {
		p, bare, dup := c[processTx.key], c[bareTx.key], c[dupTx.key]
		ts = append(ts,
			target{"round trips, new message: Process = bare tx", fmt.Sprintf("%.2f", bare.pgRT+bare.redisRT),
				fmt.Sprintf("%.2f", p.pgRT+p.redisRT), p.pgRT+p.redisRT <= bare.pgRT+bare.redisRT},
			target{"round trips, duplicate", "≤ 2", fmt.Sprintf("%.2f", dup.pgRT), dup.pgRT <= 2})
	}
	if r.batches != nil {
		best, bestW := 0.0, 0
		for _, w := range r.cfg.workers {
			if x := r.batches[w][batchCase{1000, 0}].perSec() * 1000; x > best {
				best, bestW = x, w
			}
		}
		ts = append(ts, target{fmt.Sprintf("ClaimBatch of 1,000, 0%% dups, IDs/s (best worker count: %d)", bestW),
			"≥ 200,000", count(best), best >= 200_000})
	}
	if c := r.cleanup; c != nil {
		p99 := float64(c.during.pct(0.99)) / float64(c.without.pct(0.99))
		ts = append(ts,
			target{"Cleanup rows/s", "≥ 300,000", count(c.rowsPerSec()), c.rowsPerSec() >= 300_000},
			target{"Process p99 during Cleanup ÷ alone", "≤ 2×", fmt.Sprintf("%.2f×", p99), p99 <= 2})
	}
	if r.citus != nil {
		ts = append(ts, r.citus.targets()...)
	}
	return ts
}
