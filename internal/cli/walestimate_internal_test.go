package cli

import (
	"testing"
	"time"

	"github.com/pgdedup/pgdedup"
)

// The model against the steady bench (bench/results/steady-*.md, Retention
// 192 checkpoint cycles, windows of whole spans): the cluster's full-page
// images per message at steady state were 0.686 on the plain table, 0.040
// with 12 partitions, 0.020 with 24 and 0.012 with 48. The model counts the
// key index's alone, so it gives a little less: the rest are the heap's, the
// business table's and the expires_at index's. (The empty table's run is no
// baseline to subtract: its current partition, or its plain index, grows
// from empty over the window too.) A uuid key index filled by random inserts
// holds about 212 rows per page (500,000 random keys: 19.4 MB).
func TestWALModelMatchesTheSteadyBench(t *testing.T) {
	const perPage, cycles = 212.0, 192.0
	for _, tc := range []struct {
		name      string
		got, want float64
	}{
		{"plain", imagesPerClaim(cycles / perPage), 0.686},
		{"partitioned, 12", imagesPerClaimGrowing(cycles / 12 / perPage), 0.040},
		{"partitioned, 24", imagesPerClaimGrowing(cycles / 24 / perPage), 0.020},
		{"partitioned, 48", imagesPerClaimGrowing(cycles / 48 / perPage), 0.012},
	} {
		if r := tc.got / tc.want; r < 0.75 || r > 1.05 {
			t.Errorf("%s: the model gives %.3f images per claim, %.2f× the %.3f the bench measured (want 0.75× to 1.05×: the key index's share)", tc.name, tc.got, r, tc.want)
		}
	}
}

// estimateWAL reads the Retention held from the oldest row, the key index's
// rows per page from its size, and gives no estimate where the model does not
// apply.
func TestEstimateWAL(t *testing.T) {
	now := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	st := pgdedup.Stats{
		Now: now, Rows: 2_120_000,
		Indexes: []pgdedup.IndexStats{{Name: "processed_messages_expires_at_idx", Method: "btree", Bytes: 50 << 20},
			{Name: "processed_messages_pkey", Method: "btree", Bytes: 10_000 * 8192}},
		Consumers: []pgdedup.ConsumerStats{{Consumer: "a", OldestProcessedAt: now.Add(-time.Hour)}, {Consumer: "b", OldestProcessedAt: now.Add(-16 * time.Hour)}},
	}
	e := estimateWAL(st, 5*time.Minute)
	if e == nil || e.Held != 16*time.Hour || e.RowsPerPage != 212 || e.KeyIndex != "processed_messages_pkey" || e.Partitions != pgdedup.DefaultPartitions {
		t.Fatalf("estimate %+v", e)
	}
	if want := imagesPerClaim(192.0 / 212); e.PlainImages != want || e.PlainBytes != want*pageImageBytes {
		t.Errorf("plain: %.3f images, %.0f bytes; want %.3f", e.PlainImages, e.PlainBytes, want)
	}
	if e.PartitionedImages <= 0 || e.PartitionedImages >= e.PlainImages/10 {
		t.Errorf("partitioned: %.3f images against plain %.3f", e.PartitionedImages, e.PlainImages)
	}
	for name, st := range map[string]pgdedup.Stats{
		"partitioned": {Now: now, Rows: 1, Partitions: []pgdedup.PartitionStats{{}}, Indexes: st.Indexes, Consumers: st.Consumers},
		"empty":       {Now: now, Indexes: st.Indexes},
		"no key":      {Now: now, Rows: 1, Consumers: st.Consumers},
		"young":       {Now: now, Rows: 1, Indexes: st.Indexes, Consumers: []pgdedup.ConsumerStats{{OldestProcessedAt: now.Add(-time.Minute)}}},
	} {
		if e := estimateWAL(st, 5*time.Minute); e != nil {
			t.Errorf("%s: %+v, want no estimate", name, e)
		}
	}
}
