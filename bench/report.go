package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// report is everything a run measured, rendered as markdown.
type report struct {
	cfg                   config
	start                 time.Time
	took                  time.Duration
	loadBefore, loadAfter string
	machine               []string
	settings              map[string]string // the server settings machine reported

	costs     map[string]cost
	walMethod string
	tables    []*msgTable
	batches   map[int]map[batchCase]series
	cleanup   *cleanupResult
	citus     *citusResult
	growth    *growthReport
}

func (r *report) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("%s", header(r.cfg.args, r.start, r.took, r.loadBefore, r.loadAfter))
	for _, m := range r.machine {
		p("- %s\n", m)
	}
	p("- Method: %d interleaved rounds of %s per scenario after a warm-up round, the order rotating each round; "+
		"throughput and latency are medians over rounds; a ratio is the median over rounds of the ratio within the round.\n",
		r.cfg.rounds, r.cfg.round)
	for _, n := range r.proportions() {
		p("- %s\n", n)
	}

	if r.costs != nil {
		p("\n### Round trips and WAL per message\n\n")
		p("One worker; %d messages × %d per scenario. Round trips counted by an in-process proxy; WAL by %s.\n\n",
			r.cfg.accountMessages, r.cfg.accountReps, r.walMethod)
		p("| scenario | Postgres round trips | Redis round trips | WAL bytes | of which full-page images |\n|---|--:|--:|--:|--:|\n")
		for _, s := range messageScenarios {
			c := r.costs[s.key]
			p("| %s | %.2f | %.2f | %.0f | %.0f |\n", s.title, c.pgRT, c.redisRT, c.walBytes, c.fpiBytes)
		}
	}
	for _, t := range r.tables {
		p("\n### Messages, %s (median round trip: Postgres %s ms, Redis %s ms)\n\n", t.network, ms(t.pgRTT), ms(t.redisRTT))
		p("| scenario |")
		for _, w := range r.cfg.workers {
			p(" %s msgs/s | × bare | p50 ms | p99 ms |", workersLabel(w))
		}
		p("\n|---|%s\n", strings.Repeat("--:|", 4*len(r.cfg.workers)))
		for _, s := range messageScenarios {
			p("| %s |", s.title)
			for _, w := range r.cfg.workers {
				res := t.results[w]
				sr := res[s.key]
				p(" %s | %.2f× | %s | %s |", count(sr.perSec()), sr.ratio(res[bareTx.key]), ms(sr.pct(0.5)), ms(sr.pct(0.99)))
			}
			p("\n")
		}
	}
	if r.batches != nil {
		p("\n### ClaimBatch (one transaction per batch: BEGIN, ClaimBatch, COMMIT)\n\n")
		p("| batch | duplicates |")
		for _, w := range r.cfg.workers {
			p(" %s IDs/s | batch p50 ms | batch p99 ms |", workersLabel(w))
		}
		p("\n|--:|--:|%s\n", strings.Repeat("--:|", 3*len(r.cfg.workers)))
		for _, c := range batchCases {
			p("| %s | %d%% |", count(float64(c.size)), c.dupPct)
			for _, w := range r.cfg.workers {
				sr := r.batches[w][c]
				p(" %s | %s | %s |", count(sr.perSec()*float64(c.size)), ms(sr.pct(0.5)), ms(sr.pct(0.99)))
			}
			p("\n")
		}
	}
	if c := r.cleanup; c != nil {
		batch := "the default Config.CleanupBatchSize"
		if c.batch > 0 {
			batch = "CleanupBatchSize " + count(float64(c.batch))
		}
		p("\n### Cleanup (%s expired rows inserted in %s, then ANALYZE; %s)\n\n",
			count(float64(c.rows)), c.populate.Round(time.Second), batch)
		p("| rows deleted | Cleanup time | rows/s | Process p50 / p99 ms, alone | p50 / p99 ms, during Cleanup | p99 during ÷ alone |\n|--:|--:|--:|--:|--:|--:|\n")
		p("| %s | %s | %s | %s / %s | %s / %s | %.2f× |\n", count(float64(c.rows)), c.took.Round(time.Millisecond),
			count(c.rowsPerSec()), ms(c.without.pct(0.5)), ms(c.without.pct(0.99)), ms(c.during.pct(0.5)), ms(c.during.pct(0.99)),
			float64(c.during.pct(0.99))/float64(c.without.pct(0.99)))
	}
	if r.citus != nil {
		p("%s", r.citus.markdown(r.cfg))
	}
	if r.growth != nil {
		p("%s", r.growth.markdown(r.cfg.workers, r.cfg.rounds, r.cfg.round))
	}
	if ts := r.targets(); len(ts) > 0 {
		p("\n### Targets\n\n| target | goal | measured | met |\n|---|--:|--:|---|\n")
		for _, t := range ts {
			p("| %s | %s | %s | %s |\n", t.name, t.goal, t.measured, yesNo(t.met))
		}
	}
	return b.String()
}

func workersLabel(w int) string {
	if w == 1 {
		return "1 worker:"
	}
	return strconv.Itoa(w) + " workers:"
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
}

// count formats a rate or count with thousands separators.
func count(x float64) string {
	s := strconv.FormatInt(int64(x+0.5), 10)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// proportions marks what makes these figures those of a toy, not of a
// production table: a figure read without it would be trusted too far.
func (r *report) proportions() []string {
	var notes []string
	if r.costs != nil || r.tables != nil || r.batches != nil || r.cleanup != nil || r.citus != nil || r.growth != nil {
		notes = append(notes, "Toy proportions: the tables these parts write to hold minutes of messages, not rate × Retention "+
			"(a production table spans hundreds of checkpoint cycles). WAL per message here is that of a small table, "+
			"whose index leaves are mostly imaged once per checkpoint; on a big table it is several times higher "+
			"(docs/operations.md, sizing). Cleanup's expired rows are inserted in bulk just before it runs.")
	}
	if r.settings["fsync"] == "off" || r.settings["synchronous_commit"] == "off" {
		notes = append(notes, "fsync or synchronous_commit is off: commit latencies are not those of a durable server.")
	}
	return notes
}
