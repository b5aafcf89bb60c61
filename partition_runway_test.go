package pgdedup_test

import (
	"testing"
	"time"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// Cleanup keeps partitions created Config.Runway ahead, beyond the three
// that Setup makes, at most 8 per round. Once it ran, claims go on for the
// runway with no cleaner: here 200 ms partitions and a 3-second runway,
// claims until 400 ms before its end. With the fewest ahead (3), they would
// have found no partition after about 600 ms.
func TestPartitionedRunway(t *testing.T) {
	t.Parallel()
	const span, runway = 200 * time.Millisecond, 3 * time.Second
	b := setupPartitioned(t, pgdedup.Config{Retention: 2 * time.Second, Partitions: 10, Runway: runway})
	ctx := ctxT(t)
	st, err := b.store.Stats(ctx)
	if err != nil || st.PartitionRunway == nil {
		t.Fatalf("Stats: %+v, %v", st, err)
	}
	if *st.PartitionRunway > 4*span {
		t.Errorf("runway after Setup: %s, want at most 4 partitions (Setup makes 3 ahead)", *st.PartitionRunway)
	}
	before := time.Now()
	if _, err := b.store.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	// On Citus creating partitions takes a while: the runway is counted
	// from the Cleanup's start.
	if st, err = b.store.Stats(ctx); err != nil || st.PartitionRunway == nil {
		t.Fatalf("Stats: %+v, %v", st, err)
	}
	// The runway is measured from st.Now: Stats reads sizes after it, and on
	// a loaded machine it returns long enough later that time.Now() plus the
	// runway lay past the last partition (CI once claimed 4.6 s into a
	// runway that ended sooner).
	end := st.Now.Add(*st.PartitionRunway)
	if end.Sub(before) < runway-span {
		t.Fatalf("a Cleanup at %s created partitions up to %s only, want a runway of %s", before, end, runway)
	}
	for i := 0; time.Now().Before(end.Add(-2 * span)); i++ {
		id := pgtest.SeedID("m", i)
		if processed, err := b.store.Process(ctx, id, charge(id)); err != nil || !processed {
			t.Fatalf("%s after the last cleanup: processed=%v err=%v", time.Since(before).Round(time.Millisecond), processed, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
