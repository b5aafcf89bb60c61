package main

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A tiny claimcost run (CI) reports every table with its locks, times and
// throughput, counts more locks on the populated partitioned table than on
// the plain one, and leaves no schema behind.
func TestClaimCostTiny(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := testConfig(t)
	var err error
	cfg, err = parseFlags([]string{"-database-url", cfg.databaseURL, "-only", "claimcost", "-claimcost-partitions", "4",
		"-claimcost-rows", "2000", "-claimcost-rounds", "1", "-claimcost-round", "100ms", "-claimcost-workers", "2",
		"-claimcost-business-row"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg.claimCost.explains = 2
	schemas := schemaCounter(ctx, t, cfg.databaseURL, "pgdedup_claimcost_")
	before := schemas()
	var out bytes.Buffer
	if err := run(ctx, cfg, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	locks := map[string]int{}
	row := regexp.MustCompile(`(?m)^\| ([^|]+) \| ([^|]+) \| (\d+) \| (\d+) \| [0-9.]+ ms \| [0-9.]+ ms \| \d+, \d+ \| [0-9,]+ \| [0-9.]+× \|`)
	for _, m := range row.FindAllStringSubmatch(out.String(), -1) {
		locks[m[1]], _ = strconv.Atoi(m[3])
	}
	for _, name := range []string{"plain empty", "partitioned-4 empty", "partitioned-12 empty, with expires_at index", "plain empty, exec mode",
		"partitioned-12 empty, exec mode, with expires_at index", "plain populated", "partitioned-4 populated", "partitioned-12 populated, exec mode, with expires_at index",
		"plain populated, with a time", "partitioned-12 populated, with a time", "plain populated, exec mode, with a time", "partitioned-12 populated, exec mode, with a time",
		"partitioned-12 populated, sent before its partition", "partitioned-12 populated, exec mode, sent before its partition"} {
		if _, ok := locks[name]; !ok {
			t.Errorf("report lacks a row for %q:\n%s", name, out.String())
		}
	}
	if p, q := locks["plain populated"], locks["partitioned-4 populated"]; p < 1 || q <= p {
		t.Errorf("relation locks per claim: plain %d, partitioned-4 %d; want the partitioned table's more", p, q)
	}
	if !strings.Contains(out.String(), "| partitioned-4 populated | ") || !strings.Contains(out.String(), "| claim statement | its look-up alone |") {
		t.Errorf("report lacks the statement times:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "`Store.Process` with one business row") {
		t.Errorf("report does not say Process wrote one business row:\n%s", out.String())
	}
	// Issue 29's ratios: with a time against the plain table with a time,
	// prepared and exec mode, and without.
	target := regexp.MustCompile(`(?m)^\| (partitioned-12 populated[^|]*) \| [0-9.]+×[^|]* \| [0-9.]+× \| ([^|]+) \|$`)
	targets := map[string]string{}
	for _, m := range target.FindAllStringSubmatch(out.String(), -1) {
		targets[m[1]] = strings.TrimSpace(m[2])
	}
	for name, want := range map[string]string{"partitioned-12 populated, with a time": "–", "partitioned-12 populated, sent before its partition": "–",
		"partitioned-12 populated, with a time, at the defaults (3 in 4 fresh)": "≥ 0.95×", "partitioned-12 populated, exec mode, with a time, at the defaults (3 in 4 fresh)": "≥ 0.85×",
		"partitioned-12 populated": "≥ 0.75×", "partitioned-12 populated, exec mode": "–"} {
		if got, ok := targets[name]; !ok || got != want {
			t.Errorf("issue 29's ratios: %q has target %q (found %v), want %q:\n%s", name, got, ok, want, out.String())
		}
	}
	if after := schemas(); after != before {
		t.Errorf("%d pgdedup_claimcost_ schemas before the run, %d after", before, after)
	}
}
