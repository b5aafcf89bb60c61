package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// A tiny compare run: every scenario consumes its records, the offsets keep
// one row per partition and the other method one per record, and the scratch
// schema is dropped.
func TestCompare(t *testing.T) {
	url := pgdeduptest.URL(t)
	db := pgdeduptest.New(t) // only to count schemas
	schemas := func() int {
		return pgdeduptest.Count(t, db.Pool, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'pgdedup\_compare\_%'`)
	}
	before := schemas()
	var out bytes.Buffer
	err := compare(context.Background(), compareConfig{DatabaseURL: url, Records: 40, Rounds: 2, Batch: 10, Partitions: 2}, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, want := range []string{
		"| offset in the transaction (ProcessOffsets) | 10 |",
		"| one row per record (ProcessBatch) | 10 |",
		"| no dedup (the charge alone) | 1 |",
		// 2 rounds of 40 batched and 4 single records for each method.
		"kept after 88 records by each method: offsets 4 rows",
		"one row per record 88 rows",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if after := schemas(); after != before {
		t.Errorf("%d compare schemas before, %d after: the scratch schema was not dropped", before, after)
	}
}
