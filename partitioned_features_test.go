package pgdedup_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup"
)

// Lookup, Forget, fingerprints, stored results and per-call retention on the
// partitioned layout.
func TestPartitionedFeatures(t *testing.T) {
	t.Parallel()
	b := setupPartitioned(t, pgdedup.Config{Retention: time.Hour})
	ctx := ctxT(t)
	if _, err := b.store.Process(ctx, "m1", charge("o1"), pgdedup.WithFingerprint([]byte("a")), pgdedup.WithRetention(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := b.store.Lookup(ctx, "m1")
	if err != nil || !ok || rec.ExpiresAt.Sub(rec.ProcessedAt).Round(time.Second) != 2*time.Hour {
		t.Errorf("Lookup: %+v, %v, %v", rec, ok, err)
	}
	if _, err := b.store.Process(ctx, "m1", charge("o1"), pgdedup.WithFingerprint([]byte("z"))); !errors.Is(err, pgdedup.ErrPayloadMismatch) {
		t.Errorf("another fingerprint: %v", err)
	}
	res, processed, err := b.store.ProcessResult(ctx, "r1", reply("r1"))
	if err != nil || !processed {
		t.Fatal(res, processed, err)
	}
	if again, processed, err := b.store.ProcessResult(ctx, "r1", reply("r1")); err != nil || processed || string(again) != string(res) {
		t.Errorf("duplicate: %q, %v, %v; want %q", again, processed, err, res)
	}
	if ok, err := b.store.Forget(ctx, "m1"); err != nil || !ok {
		t.Errorf("Forget: %v, %v", ok, err)
	}
	if ok, err := b.store.Forget(ctx, "m9"); err != nil || ok {
		t.Errorf("Forget of an unknown ID: %v, %v", ok, err)
	}
	if recorded(t, b.pool, "billing", "m1") || recorded(t, b.pool, "billing", "m9") {
		t.Error("rows left after Forget")
	}
	if processed, err := b.store.Process(ctx, "m1", charge("o1")); err != nil || !processed {
		t.Errorf("Process after Forget: %v, %v", processed, err)
	}
}
