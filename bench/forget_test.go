package main

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"testing"
	"time"
)

// A tiny forget run (CI) reports a row per size with both layouts' times,
// forgets every ID on both (forgetRun checks), and leaves no schema behind.
func TestForgetTiny(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := parseFlags([]string{"-database-url", testConfig(t).databaseURL, "-only", "forget", "-forget-rows", "300,3000"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	schemas := schemaCounter(ctx, t, cfg.databaseURL, "pgdedup_forget_")
	before := schemas()
	var out bytes.Buffer
	if err := run(ctx, cfg, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^\| (300|3,000) \| [0-9.]+ ms \| [0-9.]+ [kM]B \| [0-9.]+ ms \| [0-9.]+ [kM]B \| \d+× \|$`)
	if got := len(row.FindAllString(out.String(), -1)); got != 2 {
		t.Errorf("want a row for 300 and for 3,000 IDs, found %d in:\n%s", got, out.String())
	}
	if after := schemas(); after != before {
		t.Errorf("%d forget schemas left behind", after-before)
	}
	if _, err := parseFlags([]string{"-only", "forget", "-forget-rows", "0"}, io.Discard); err == nil {
		t.Error("-forget-rows 0: no error")
	}
}
