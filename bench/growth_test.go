package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// A tiny growth run (CI) measures both schema versions on both tables, reports
// them, and leaves no schema behind.
func TestGrowthTiny(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := testConfig(t)
	var err error
	cfg, err = parseFlags([]string{"-database-url", cfg.databaseURL, "-only", "growth", "-growth-rows", "3000",
		"-workers", "1,2", "-rounds", "1", "-round", "30ms", "-growth-steady", "100ms"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	schemas := schemaCounter(ctx, t, cfg.databaseURL, "pgdedup_growth_")
	before := schemas()
	var out bytes.Buffer
	if err := run(ctx, cfg, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"### Growth: an empty table and one of 3k rows", "| v2 | Process | 1 | ", "| v3 | Process | 2 | ",
		"| v2 | ClaimBatch of 100 | 2 | ", "| v3 | ClaimBatch of 100 | 1 | ", "| v3 | 3k | ", "Steady state: Process on the 3k-row table"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if after := schemas(); after != before {
		t.Errorf("%d pgdedup_growth_ schemas before the run, %d after", before, after)
	}
}
