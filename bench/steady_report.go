package main

import (
	"cmp"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/pgdedup/pgdedup"
)

// markdown is the steady part's results file: a header that says how to get
// the same figures again and where they come from, the side-by-side table,
// the detail of each run and the checks.
func (r steadyResult) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	c := r.cfg
	p("## Steady state at production proportions (%s layout)\n\n", c.layout)
	p("- Command: `%s`\n", c.command)
	p("- Date: %s UTC, took %s\n", r.start.UTC().Format("2006-01-02 15:04"), r.took.Round(time.Second))
	p("- Machine: %d cores (%s), %s RAM, load average (1, 5, 15 min) %s at the start, %s at the end; "+
		"the bench and the server share it. %s\n", runtime.NumCPU(), cpuModel(), memTotal(), r.loadBefore, r.loadAfter, busy(r.loadBefore, r.loadAfter))
	p("- PostgreSQL: %s, a throwaway cluster; %s\n", r.server, r.settings)
	cp := "the server's `checkpoint_timeout`"
	if !c.serverCheckpoints() {
		cp = "a `CHECKPOINT` the bench issues every cycle (`checkpoint_timeout` cannot be under 30 s)"
	}
	p("- Proportion: checkpoint cycle %s (%s), Retention %d × cycle = %s; the full table is preloaded with "+
		"rate × Retention = %s rows, expiries spread evenly, so the cleaner deletes as many rows as claims insert "+
		"(the load took %s; rows that expired meanwhile are deleted in the warm-up, hence fewer rows at the window's start)\n",
		c.cycle, cp, c.ratio, c.retention(), count(float64(c.rows())), r.full.loadTook.Round(time.Second))
	if c.layout == "partitioned" {
		n := cmp.Or(c.partitions, pgdedup.DefaultPartitions)
		p("- Layout: partitioned by claim time, %d partitions per Retention (`Config.Partitions`; span %s), made by `Store.Setup`, "+
			"kept by `RunCleaner`; the partitions get the server's autovacuum settings (PostgreSQL takes no storage parameters "+
			"on a partitioned table)\n", n, c.retention()/time.Duration(n))
		span := c.retention() / time.Duration(n)
		p("- Where the window fell: the full table's began %s into its partition's span of %s (0 is the switch) and lasted %.2f spans. "+
			"Page images grow with the current partition's index over a span, so a window shorter than a span shows fewer of them "+
			"early in it and more late: quote WAL only from whole spans (`-steady-cycles` a multiple of span ÷ cycle = %.2f)\n",
			spanOffset(r.full.windowAt, span).Round(time.Second), span, float64(r.full.window)/float64(span), float64(span)/float64(c.cycle))
	}
	if c.sentAt {
		p("- Claims pass a time: each `Process` call passes its message's first-sent time (`WithSentAt`: when it was queued, "+
			"a redelivery its original's, a preloaded ID the time it was claimed at), `SentAtMargin` %s "+
			"(the default hour at the default 48 h Retention, compressed like the Retention)\n", c.sentAtMargin())
	}
	p("- Load: `Store.Process` with one business row at %d new messages/s plus %.0f%% redeliveries "+
		"(half of recent messages, half of preloaded IDs), %d workers on a pool of %d connections; `RunCleaner` every %s; "+
		"autovacuum on, `autovacuum_naptime` %s (production's 1 min, compressed like the cycle), scale factors 0.01 on the plain table\n",
		c.rate, 100*c.dupShare, c.workers, c.pool(), c.cleanEach, c.naptime())
	p("- Measured: %d warm-up cycles, then a `CHECKPOINT` and %d whole cycles. WAL is the `pg_current_wal_lsn()` "+
		"difference and images the `pg_stat_wal.wal_fpi` difference over the window, everything the cluster wrote "+
		"(claims, business rows, cleanup, autovacuum), divided by the new messages processed in it. "+
		"Latency is each `Process` call in the window, redeliveries included. Throughput: %d workers unthrottled, "+
		"new IDs, each table's cleaner running, after both windows, in %d interleaved rounds of %s per table (the order "+
		"rotating), so that a change in the machine's load falls on both; the median round, and the median of the "+
		"rounds' ratios\n\n", c.warmup, c.cycles, c.tputWorkers, steadyRounds, c.tputFor/steadyRounds)

	e, f := r.empty, r.full
	ratio := func(a, b float64) string {
		if b == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f×", a/b)
	}
	p("| table | rows (window start → end) | WAL per message | full-page images per message | p50 | p99 | %d-worker msgs/s | dead tuples (max, end) |\n",
		c.tputWorkers)
	p("|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, t := range []steadyRun{e, f} {
		label := "empty at the start"
		if t.preloaded > 0 {
			label = fmt.Sprintf("steady state, rate × Retention (%d cycles)", c.ratio)
		}
		p("| %s | %s → %s | %s B | %.3f | %s ms | %s ms | %s | %s, %s |\n", label, count(float64(t.rowsStart)), count(float64(t.rowsEnd)),
			count(t.walPerMsg()), t.fpiPerMsg(), ms(t.p50), ms(t.p99), count(t.tput), count(float64(t.deadMax)), count(float64(t.deadEnd)))
	}
	p("| steady ÷ empty | | **%s** | | %s | **%s** | **%s** | |\n\n",
		ratio(f.walPerMsg(), e.walPerMsg()), ratio(float64(f.p50), float64(e.p50)), ratio(float64(f.p99), float64(e.p99)), fmt.Sprintf("%.2f×", r.tputRatio))

	p("Latency by tenth of the checkpoint cycle, over the window's %d cycles (the window starts with a `CHECKPOINT` and the "+
		"server's `checkpoint_timeout` counts from it; the first tenth holds the claims that write most full-page images), "+
		"so that a spike cannot hide in the window's p99. Calls are counted in the tenth they ended in; "+
		"\"queued p99\" is from the message's entry into the workers' queue (its wait for one of the %d workers, then `Process`):\n\n",
		c.cycles, c.workers)
	p("| part of the cycle | empty: calls | p50 | p99 | queued p99 | steady state: calls | p50 | p99 | queued p99 | p99 steady ÷ empty |\n")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for k := range min(len(e.phases), len(f.phases)) {
		pe, pf := e.phases[k], f.phases[k]
		p("| %d–%d%% | %s | %s ms | %s ms | %s ms | %s | %s ms | %s ms | %s ms | %s |\n", 100*k/steadyPhases, 100*(k+1)/steadyPhases,
			count(float64(pe.n)), ms(pe.p50), ms(pe.p99), ms(pe.p99Queued), count(float64(pf.n)), ms(pf.p50), ms(pf.p99), ms(pf.p99Queued),
			ratio(float64(pf.p99), float64(pe.p99)))
	}
	p("| whole window | %s | %s ms | %s ms | %s ms | %s | %s ms | %s ms | %s ms | %s |\n",
		count(float64(e.deliveries)), ms(e.p50), ms(e.p99), ms(e.p99Queued), count(float64(f.deliveries)), ms(f.p50), ms(f.p99), ms(f.p99Queued),
		ratio(float64(f.p99), float64(e.p99)))
	p("| worst tenth's p99 ÷ window's | | | %s | | | | %s | | |\n\n",
		ratio(float64(worstP99(e.phases)), float64(e.p99)), ratio(float64(worstP99(f.phases)), float64(f.p99)))

	p("| detail | empty | steady state |\n|---|--:|--:|\n")
	row := func(name string, fn func(steadyRun) string) { p("| %s | %s | %s |\n", name, fn(e), fn(f)) }
	row("window", func(t steadyRun) string { return t.window.Round(100 * time.Millisecond).String() })
	row("load average (1, 5, 15 min) at the window's start; end (the two windows run one after the other, "+
		"so other work on the machine can fall on one only: the latency ratios are not interleaved)",
		func(t steadyRun) string { return t.loadFrom + "; " + t.loadTo })
	row("checkpoints counted in the window (pg_stat_bgwriter)", func(t steadyRun) string { return fmt.Sprint(t.checkpoints) })
	row("new messages processed in the window", func(t steadyRun) string { return count(float64(t.messages)) })
	row("Process calls in the window", func(t steadyRun) string { return count(float64(t.deliveries)) })
	row("WAL in the window", func(t steadyRun) string { return mb(t.walBytes) })
	row("full-page images in the window", func(t steadyRun) string { return count(float64(t.fpi)) })
	row("rows deleted by the cleaner in the window", func(t steadyRun) string { return count(float64(t.deleted)) })
	row("autovacuum runs on the table in the window", func(t steadyRun) string { return fmt.Sprint(t.autovacuums) })
	row("table (heap) at the end", func(t steadyRun) string { return mb(t.heap) })
	row("indexes at the end", func(t steadyRun) string { return mb(t.indexes) })
	row("heap per million rows", func(t steadyRun) string { return perMillion(t.heap, t.rowsEnd) })
	row("indexes per million rows", func(t steadyRun) string { return perMillion(t.indexes, t.rowsEnd) })
	row("p99 of the warm-up (not in the window: right after the preload's CHECKPOINT)", func(t steadyRun) string { return ms(t.p99Warmup) + " ms" })
	row("preload, VACUUM and CHECKPOINT", func(t steadyRun) string { return t.loadTook.Round(time.Second).String() })
	p("\n%s\n", r.scaled())
	for _, ch := range r.checks {
		p("- %s %s\n", map[bool]string{true: "PASS", false: "FAIL"}[ch.ok], ch.what)
	}
	p("\n")
	return b.String()
}

// The rate and Retention that scaled scales the run's figures to, for the
// docs to link to rather than to work out by hand.
const (
	scaleRate      = 1000 // new messages/s
	scaleRetention = 48 * time.Hour
)

// scaled is the run's WAL per message and size per row scaled to a day at
// scaleRate and to a table of scaleRetention at it: arithmetic on the
// measured figures, which says so.
func (r steadyResult) scaled() string {
	e, f := r.empty, r.full
	perDay := float64(scaleRate) * 86400
	rows := perDay * scaleRetention.Hours() / 24
	s := fmt.Sprintf("Scaled (arithmetic on the figures above, GB = 10⁹ bytes): WAL a day at %s new messages/s: "+
		"%s at steady state, %s on the empty table (WAL per message × %s messages; it depends on the Retention/cycle "+
		"proportion, not on the rate)", count(scaleRate), gb(f.walPerMsg()*perDay), gb(e.walPerMsg()*perDay), count(perDay))
	if f.rowsEnd >= 1000 {
		perRow := float64(f.heap+f.indexes) / float64(f.rowsEnd)
		s += fmt.Sprintf("; the table and its indexes holding %s of it (%s rows): %s (steady state's heap and indexes per row)",
			scaleRetention, count(rows), gb(perRow*rows))
	}
	return s + ".\n"
}

// gb formats bytes in GB of 10⁹ bytes.
func gb(bytes float64) string { return fmt.Sprintf("%.1f GB", bytes/1e9) }

func perMillion(bytes, rows int64) string {
	if rows < 1000 {
		return "–"
	}
	return mb(int64(float64(bytes) * 1e6 / float64(rows)))
}

// partitionOrigin is where the partitioned layout's grid of spans starts
// (the library's partitioned.Origin, internal to it).
var partitionOrigin = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// spanOffset is how far t lies into its partition's span, partitions of
// span starting from partitionOrigin, as date_bin places them.
func spanOffset(t time.Time, span time.Duration) time.Duration {
	return t.Sub(partitionOrigin) % span
}
