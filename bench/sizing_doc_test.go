package main

import (
	"os"
	"strings"
	"testing"
)

// docs/sizing.md's WAL table is what the steady results files say: after a
// run, `go run -C bench . -sizing-doc ../docs/sizing.md` writes it again.
func TestSizingDocCurrent(t *testing.T) {
	b, err := os.ReadFile("../docs/sizing.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := withSizingTable(string(b), "results")
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != want {
		t.Errorf("docs/sizing.md's WAL table is not the results files': run go run -C bench . -sizing-doc ../docs/sizing.md")
	}
	table, err := sizingTable("results")
	if err != nil {
		t.Fatal(err)
	}
	// Every results file has a row, with its figures.
	files, _ := os.ReadDir("results")
	for _, f := range files {
		if name := f.Name(); strings.HasPrefix(name, "steady-") && !strings.Contains(table, "(../bench/results/"+name+")") {
			t.Errorf("no row for %s", name)
		}
	}
	// The figures are read from the right columns.
	dir := t.TempDir()
	md := "- Command: `go run -C bench . -only steady -layout partitioned -partitions 24 -steady-sent-at`\n" +
		"- Where the window fell: the full table's began 1m into its partition's span of 4m0s (0 is the switch) and lasted 2.00 spans.\n\n" +
		"| table | rows (window start → end) | WAL per message | full-page images per message | p50 | p99 | 8-worker msgs/s | dead tuples (max, end) |\n" +
		"|---|--:|--:|--:|--:|--:|--:|--:|\n" +
		"| empty at the start | 1 → 2 | 500 B | 0.010 | 1 ms | 2 ms | 6,000 | 0, 0 |\n" +
		"| steady state, rate × Retention (192 cycles) | 3 → 4 | 600 B | 0.020 | 1 ms | 3 ms | 5,000 | 7, 0 |\n" +
		"| steady ÷ empty | | **1.20×** | | 1.00× | **1.50×** | **0.83×** | |\n"
	if err := os.WriteFile(dir+"/steady-x.md", []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	table, err = sizingTable(dir)
	if want := "| partitioned, 24 | with a time | 2.00 | 600 B | 1.20× | 0.020 | 1.50× | 0.83× | 7, 0 | [steady-x](../bench/results/steady-x.md) |"; err != nil || !strings.Contains(table, want) {
		t.Errorf("%v:\n%s\nwant the row %s", err, table, want)
	}
}
