package main

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup/examples/internal/fleet"
)

// childEnv makes the test binary run as the consumer command instead of the
// tests, so the kill test starts real consumer processes without a separate
// build (and they run with the race detector too).
const childEnv = "PGDEDUP_KAFKA_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(runWithSignals(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// proc is one consumer process started by the test.
type proc = fleet.Proc[*procLog]

// startConsumer starts the test binary as "kafka consume args...".
func startConsumer(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return fleet.StartWith(t, childEnv, name, &procLog{}, args...)
}

// procLog counts a consumer's per-batch log lines (msg=batch) and keeps its
// last lines for failure messages. It is what the test knows about batches
// that were rolled back by a kill: their lines were written, their rows are
// gone.
type procLog struct {
	fleet.Lines
	n    logCounts
	last time.Time // when the last batch line came
}

// logCounts are the batches a consumer logged, by outcome, and their records.
type logCounts struct {
	batches       int
	records       int // in batches that committed or were skipped whole
	skipped       int // records at or below the stored offset: handler not run
	charged       int
	producedTwice int
	rejected      int
	duplicate     int // batches skipped whole
	fenced        int
	inFlight      int
	failed        int
	assignments   int
	races         int // "DATA RACE" reports from the race detector
}

func (c *logCounts) add(o logCounts) {
	c.batches += o.batches
	c.records += o.records
	c.skipped += o.skipped
	c.charged += o.charged
	c.producedTwice += o.producedTwice
	c.rejected += o.rejected
	c.duplicate += o.duplicate
	c.fenced += o.fenced
	c.inFlight += o.inFlight
	c.failed += o.failed
	c.assignments += o.assignments
	c.races += o.races
}

// Write takes the process's output; it never fails.
func (l *procLog) Write(b []byte) (int, error) {
	l.Split(b, l.line)
	return len(b), nil
}

var attrRe = regexp.MustCompile(` (\w+)=(\S+)`)

func (l *procLog) line(s string) {
	switch {
	case strings.Contains(s, "DATA RACE"):
		l.n.races++
	case strings.Contains(s, " msg=assigned "):
		l.n.assignments++
	}
	if !strings.Contains(s, " msg=batch ") {
		return
	}
	attrs := map[string]string{}
	for _, m := range attrRe.FindAllStringSubmatch(s, -1) {
		attrs[m[1]] = m[2]
	}
	num := func(k string) int { n, _ := strconv.Atoi(attrs[k]); return n }
	l.n.batches++
	l.last = time.Now()
	switch attrs["outcome"] {
	case "processed", "duplicate":
		l.n.records += num("records")
		l.n.skipped += num("skipped")
		l.n.charged += num("charged")
		l.n.producedTwice += num("produced_twice")
		l.n.rejected += num("rejected")
		if attrs["outcome"] == "duplicate" {
			l.n.duplicate++
		}
	case "fenced":
		l.n.fenced++
	case "in_flight":
		l.n.inFlight++
	default:
		l.n.failed++
	}
}

// lastBatch returns when the process last logged a batch.
func (l *procLog) lastBatch() (last time.Time) {
	l.Do(func() { last = l.last })
	return last
}

// counts returns the counters so far.
func (l *procLog) counts() (c logCounts) {
	l.Do(func() { c = l.n })
	return c
}
