package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// batchCase is one ClaimBatch scenario: batches of size IDs, dupPct percent
// of which are already recorded.
type batchCase struct {
	size, dupPct int
}

var batchCases = []batchCase{{100, 0}, {100, 50}, {1000, 0}, {1000, 50}}

func (c batchCase) String() string { return fmt.Sprintf("batch %d, %d%% dups", c.size, c.dupPct) }

// runBatches measures ClaimBatch in interleaved rounds at each worker count.
// One operation is a whole transaction: BEGIN, ClaimBatch, COMMIT. The
// duplicates of a batch are the new IDs of the same worker's previous batch,
// recorded a moment ago, like a redelivered burst.
func (b *bench) runBatches(ctx context.Context, prog *progress) (map[int]map[batchCase]series, error) {
	maxW := slicesMax(b.cfg.workers)
	e, err := b.env(ctx, "", "", maxW, nil)
	if err != nil {
		return nil, err
	}
	defer e.close()
	prev := map[batchCase][][]string{} // case -> worker -> last batch's new IDs
	for _, c := range batchCases {
		prev[c] = make([][]string, maxW)
	}
	out := map[int]map[batchCase]series{}
	for _, workers := range b.cfg.workers {
		res := map[batchCase]series{}
		out[workers] = res
		for r := range b.cfg.rounds + 1 {
			for i := range batchCases {
				c := batchCases[(i+r)%len(batchCases)]
				d := b.cfg.round
				if r == 0 {
					d = b.cfg.round / 4
				}
				prog.step("ClaimBatch, workers=%d, round %d/%d: %s", workers, r, b.cfg.rounds, c)
				got, err := measure(ctx, workers, d, nil, func(ctx context.Context, w int) error {
					var err error
					prev[c][w], err = claimBatch(ctx, e, c, prev[c][w])
					return err
				})
				if err != nil {
					return nil, fmt.Errorf("ClaimBatch, workers=%d, %s: %w", workers, c, err)
				}
				if r > 0 {
					res[c] = append(res[c], got)
				}
			}
		}
	}
	return out, nil
}

// claimBatch claims one batch of case c, taking its duplicates from recorded,
// checks that exactly the new IDs came back, and returns them.
func claimBatch(ctx context.Context, e *env, c batchCase, recorded []string) ([]string, error) {
	dups := c.size * c.dupPct / 100
	if len(recorded) < dups {
		dups = 0 // a worker's first batch has nothing recorded yet
	}
	ids := make([]string, 0, c.size)
	for range c.size - dups {
		ids = append(ids, newID())
	}
	ids = append(ids, recorded[:dups]...)
	var fresh []string
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		var err error
		fresh, err = e.store.ClaimBatch(ctx, tx, ids)
		return err
	})
	if err != nil {
		return nil, err
	}
	if want := c.size - dups; len(fresh) != want {
		return nil, fmt.Errorf("ClaimBatch returned %d new IDs, want %d", len(fresh), want)
	}
	return fresh, nil
}
