package pgdedup_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// A duplicate found while two partitions are unsealed (no cleanup sealed
// them since the ID was claimed) leaves the table as it found it, even when
// the caller's transaction commits. The hand-over claim inserts the ID into
// every unsealed partition, oldest first. Before this was fixed, a duplicate
// added a copy of the ID to the unsealed partitions newer than the first
// claim's. That copy carried the duplicate's fingerprint and no stored
// result, and Lookup then reported it as when the ID was processed.
func TestPartitionedDuplicateLeavesNoCopies(t *testing.T) {
	t.Parallel()
	b := setupPartitioned(t, pgdedup.Config{}) // 2 s partitions, no cleaner
	ctx := ctxT(t)
	original := pgdedup.WithFingerprint([]byte("payload-a"))
	if processed, err := b.store.Process(ctx, "m1", charge("o1"), original); err != nil || !processed {
		t.Fatalf("Process: processed=%v err=%v", processed, err)
	}
	first, ok, err := b.store.Lookup(ctx, "m1")
	if err != nil || !ok {
		t.Fatalf("Lookup: %v %v", ok, err)
	}
	rows := func() int {
		return pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE message_id = 'm1'`)
	}
	before := rows()

	// Two switches later, with no seal in between, the partitions of the
	// first claim and of the switch after it are both unsealed.
	waitSwitch(t, b.pool)
	waitSwitch(t, b.pool)

	claim := func(opts ...pgdedup.Option) (claimed bool, err error) {
		if txErr := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			claimed, err = b.store.Claim(ctx, tx, "m1", opts...)
			return nil // the caller commits whatever Claim said
		}); txErr != nil {
			t.Fatal(txErr)
		}
		return claimed, err
	}
	if claimed, err := claim(original); err != nil || claimed {
		t.Fatalf("Claim with the first payload: claimed=%v err=%v, want a duplicate", claimed, err)
	}
	if claimed, err := claim(pgdedup.WithFingerprint([]byte("payload-b"))); !errors.Is(err, pgdedup.ErrPayloadMismatch) || claimed {
		t.Fatalf("Claim with another payload: claimed=%v err=%v, want ErrPayloadMismatch", claimed, err)
	}
	if claimed, err := claim(); err != nil || claimed {
		t.Fatalf("Claim: claimed=%v err=%v, want a duplicate", claimed, err)
	}
	if claimed, err := claim(original); err != nil || claimed {
		t.Fatalf("Claim with the first payload again: claimed=%v err=%v, want a duplicate", claimed, err)
	}
	if after := rows(); after != before {
		t.Errorf("the duplicates' committed transactions left %d rows of m1, want the first claim's %d", after, before)
	}
	if rec, ok, err := b.store.Lookup(ctx, "m1"); err != nil || !ok || !rec.ProcessedAt.Equal(first.ProcessedAt) {
		t.Errorf("Lookup after the duplicates: %+v %v %v, want processed at %s", rec, ok, err, first.ProcessedAt)
	}
	if n := chargesPerOrder(t, b.pool)["o1"]; n != 1 {
		t.Errorf("o1 charged %d times, want 1", n)
	}
}
