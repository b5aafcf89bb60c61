package cli

import (
	"context"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
)

// pageImageBytes is what one full-page image of a B-tree leaf adds to the
// WAL: a page less its hole, about 70% full under random inserts. The steady
// bench measured 5.8 kB per image (bench/results/steady-plain.md).
const pageImageBytes = 0.7 * 8192

// walEstimate is what full-page images cost a claim on this table, by the
// model in docs/sizing.md: after each checkpoint, the first change to an
// index page logs the whole page. Claims insert keys at random places in the
// key index, so a claim writes an image when its leaf page has not changed
// since the checkpoint. With x = leaf pages ÷ claims per checkpoint cycle,
// that is x(1 − e^(−1/x)) images per claim. On the plain table x grows with
// the Retention held; on the partitioned table only the current partition's
// index takes inserts, and it grows from empty over one span.
type walEstimate struct {
	Held              time.Duration `json:"held"`               // the oldest row's age: the Retention the table holds
	CheckpointTimeout time.Duration `json:"checkpoint_timeout"` // the server's
	KeyIndex          string        `json:"key_index"`
	RowsPerPage       float64       `json:"rows_per_page"`      // rows per page of the key index
	PlainImages       float64       `json:"plain_images"`       // full-page images per claim, this table
	PartitionedImages float64       `json:"partitioned_images"` // the same on the partitioned layout
	Partitions        int           `json:"partitions"`         // pgdedup.DefaultPartitions
	PlainBytes        float64       `json:"plain_bytes"`        // PlainImages × the bytes of an image
	PartitionedBytes  float64       `json:"partitioned_bytes"`  // PartitionedImages × the bytes of an image
}

// imagesPerClaim is the full-page images per claim into an index of x leaf
// pages per claim of a checkpoint cycle, keys inserted at random.
func imagesPerClaim(x float64) float64 {
	if x <= 0 {
		return 0
	}
	return x * (1 - math.Exp(-1/x))
}

// imagesPerClaimGrowing is imagesPerClaim averaged over an index that grows
// from empty to x pages per claim of a cycle, as a partition does over its span.
func imagesPerClaimGrowing(x float64) float64 {
	const steps = 200
	sum := 0.0
	for i := range steps {
		sum += imagesPerClaim(x * (float64(i) + 0.5) / steps)
	}
	return sum / steps
}

// estimateWAL models st's plain table (nil when it cannot: a partitioned
// table, no rows, no key index, or rows spanning less than a cycle).
func estimateWAL(st pgdedup.Stats, checkpoint time.Duration) *walEstimate {
	if len(st.Partitions) > 0 || st.Rows == 0 || checkpoint <= 0 || len(st.Consumers) == 0 {
		return nil
	}
	oldest := st.Consumers[0].OldestProcessedAt
	for _, c := range st.Consumers {
		if c.OldestProcessedAt.Before(oldest) {
			oldest = c.OldestProcessedAt
		}
	}
	held := st.Now.Sub(oldest)
	var key *pgdedup.IndexStats
	for i, ix := range st.Indexes {
		if ix.Method == "btree" && strings.HasSuffix(ix.Name, "_pkey") {
			key = &st.Indexes[i]
		}
	}
	if key == nil || key.Bytes == 0 || held < checkpoint {
		return nil
	}
	perPage := float64(st.Rows) / (float64(key.Bytes) / 8192)
	cycles := float64(held) / float64(checkpoint)
	e := &walEstimate{Held: held, CheckpointTimeout: checkpoint, KeyIndex: key.Name, RowsPerPage: perPage, Partitions: pgdedup.DefaultPartitions}
	e.PlainImages = imagesPerClaim(cycles / perPage)
	e.PartitionedImages = imagesPerClaimGrowing(cycles / float64(e.Partitions) / perPage)
	e.PlainBytes, e.PartitionedBytes = e.PlainImages*pageImageBytes, e.PartitionedImages*pageImageBytes
	return e
}

// checkpointTimeout reads the server's checkpoint_timeout.
func checkpointTimeout(ctx context.Context, conn *pgx.Conn) (time.Duration, error) {
	var s int64
	err := conn.QueryRow(ctx, `SELECT setting::bigint FROM pg_catalog.pg_settings WHERE name = 'checkpoint_timeout'`).Scan(&s)
	return time.Duration(s) * time.Second, err
}
