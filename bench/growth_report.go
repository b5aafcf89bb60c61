package main

import (
	"fmt"
	"strings"
	"time"
)

// markdown renders the growth part: per version, throughput of the big table
// against the empty one, latency and WAL per message; then sizes per row; then
// the targets.
func (g *growthReport) markdown(workers []int, rounds int, round time.Duration) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	big := rowsLabel(g.cfg.rows)
	p("\n### Growth: an empty table and one of %s rows, side by side\n\n", big)
	p("Settings: %s. %d interleaved rounds of %s per (scenario, table) and worker count; %d checkpoints during the %s measured "+
		"(one CHECKPOINT before it). WAL is the server's insert-LSN difference over each sample, per message claimed "+
		"(the business row included). Schema version 2 is pgdedup before migration 00003, claimed with the statements "+
		"pgdedup sent then; version 3 is this version's Store.\n\n",
		g.settings, rounds, round, g.checkpoints, g.elapsed.Round(time.Second))
	for v, d := range g.loadTook {
		p("Loaded v%d's %s rows in %s.\n", v, big, d.Round(time.Second))
	}
	p("\n| schema | scenario | workers | empty msgs/s | %s msgs/s | × empty | p50 ms empty / %s | p99 ms empty / %s | WAL B/msg empty / %s |\n", big, big, big, big)
	p("|---|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, v := range g.cfg.versions {
		for _, sc := range growthScenarios {
			for _, w := range workers {
				e, l := g.results[growthKey{v, 0, w, sc.key}], g.results[growthKey{v, g.cfg.rows, w, sc.key}]
				if e == nil || l == nil {
					continue
				}
				per := float64(sc.perOp)
				p("| v%d | %s | %d | %s | %s | %.2f× | %s / %s | %s / %s | %s / %s |\n", v, sc.title, w,
					count(e.rounds.perSec()*per), count(l.rounds.perSec()*per), l.rounds.ratio(e.rounds),
					ms(e.rounds.pct(0.5)), ms(l.rounds.pct(0.5)), ms(e.rounds.pct(0.99)), ms(l.rounds.pct(0.99)),
					count(e.walPerMsg()), count(l.walPerMsg()))
			}
		}
	}
	p("\n| schema | table | rows | heap B/row | indexes B/row | primary key leaf density |\n|---|---|--:|--:|--:|--:|\n")
	for _, s := range g.sizes {
		rows := max(s.rowsAfter, 1)
		var idx []string
		for _, ix := range s.indexes {
			idx = append(idx, fmt.Sprintf("%s %.0f", strings.TrimPrefix(ix.name, "processed_messages_"), float64(ix.bytes)/float64(rows)))
		}
		density := "-"
		if s.avgLeafDensity > 0 {
			density = fmt.Sprintf("%.0f%%", s.avgLeafDensity)
		}
		name := "empty"
		if s.rows > 0 {
			name = big
		}
		p("| v%d | %s | %s | %.0f | %s | %s |\n", s.version, name, count(float64(s.rowsAfter)), float64(s.heap)/float64(rows), strings.Join(idx, ", "), density)
	}
	return b.String()
}
