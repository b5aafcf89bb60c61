package partitioned

import (
	"strings"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// spanStart is date_bin(span, t, '2000-01-01 UTC'): the start of t's
// partition, on the grid from the origin, before it too.
func TestSpanStart(t *testing.T) {
	span := 4 * time.Hour
	for _, c := range []struct{ t, want time.Time }{
		{time.Date(2026, 12, 5, 3, 59, 59, 0, time.UTC), time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)},
		{time.Date(2026, 12, 5, 4, 0, 0, 0, time.UTC), time.Date(2026, 12, 5, 4, 0, 0, 0, time.UTC)},
		{time.Date(2026, 12, 5, 5, 0, 0, 0, time.FixedZone("CET", 3600)), time.Date(2026, 12, 5, 4, 0, 0, 0, time.UTC)},
		{time.Date(1999, 12, 31, 23, 0, 0, 0, time.UTC), time.Date(1999, 12, 31, 20, 0, 0, 0, time.UTC)},
	} {
		if got := spanStart(c.t, span); !got.Equal(c.want) {
			t.Errorf("spanStart(%s) = %s, want %s", c.t, got, c.want)
		}
	}
	if got := timestampLiteral(time.Date(2026, 12, 5, 4, 0, 0, 1500, time.UTC)); got != `'2026-12-05 04:00:00.000001+00'::pg_catalog.timestamptz` {
		t.Errorf("timestampLiteral = %s", got)
	}
}

// A statement is rendered with the partition after the client's current one
// as its upper bound, and its time's partition as its lower bound, and is
// rendered again once the clock crosses into the next partition.
func TestRender(t *testing.T) {
	now := time.Date(2026, 12, 5, 1, 30, 0, 0, time.UTC)
	l := &Shape{span: time.Hour, clock: func() time.Time { return now }}
	tmpl := lowerMark + " " + upperMark
	key := renderKey{kind: lean}
	if got := l.render(tmpl, key, time.Time{}, now); got != `'-infinity'::pg_catalog.timestamptz '2026-12-05 03:00:00+00'::pg_catalog.timestamptz` {
		t.Errorf("without a time: %s", got)
	}
	if got := l.render(tmpl, key, now.Add(-50*time.Minute), now); !strings.HasPrefix(got, `'2026-12-05 00:00:00+00'`) {
		t.Errorf("sent 50 minutes ago: %s", got)
	}
	now = now.Add(time.Hour)
	if got := l.render(tmpl, key, time.Time{}, now); !strings.HasSuffix(got, `'2026-12-05 04:00:00+00'::pg_catalog.timestamptz`) {
		t.Errorf("an hour later: %s", got)
	}
	// A fresh claim's statement ends at the end of the client's current
	// partition.
	if got := l.render(lowerMark+" "+nextMark, renderKey{kind: fresh}, now.Add(-10*time.Minute), now); got != `'2026-12-05 02:00:00+00'::pg_catalog.timestamptz '2026-12-05 03:00:00+00'::pg_catalog.timestamptz` {
		t.Errorf("fresh: %s", got)
	}
}

// A placement's fresh claim (Claims.Fresh, on Citus) answers the row's
// processed_at: inside the client's current partition it claimed, outside
// it missed but wrote, and nothing is a duplicate. A claim sent before that
// partition reads sealed and looks the ID up first. The claim sent again
// deletes the row written first.
func TestClaimRouted(t *testing.T) {
	now := time.Date(2026, 12, 5, 1, 30, 0, 0, time.UTC)
	l := &Shape{span: time.Hour, clock: func() time.Time { return now }, routedFresh: &[4]string{"FRESH"}, undo: "UNDO", claimWith: [4]string{"CLAIM"}}
	id := shapeID()
	for _, c := range []struct {
		name                   string
		at                     *time.Time // the row returned, if any
		claimed, missed, wrote bool
	}{
		{"inside", ptr(now.Add(5 * time.Minute)), true, false, false},
		{"in the next partition", ptr(now.Add(31 * time.Minute)), false, true, true},
		{"in the one before", ptr(now.Add(-31 * time.Minute)), false, true, true},
		{"a conflict", nil, false, false, false},
	} {
		var claimed, missed bool
		var wrote time.Time
		sts := l.ClaimOne(oneOf(id, now.Add(-10*time.Minute), &claimed, &missed, &wrote, 0, time.Time{}))
		if len(sts) != 1 || sts[0].SQL != "FRESH" || sts[0].Row == nil {
			t.Fatalf("%s: %+v, want the fresh claim answering a row", c.name, sts)
		}
		if c.at != nil {
			if err := sts[0].Row(func(dest ...any) error { *dest[0].(*time.Time) = *c.at; return nil }); err != nil {
				t.Fatal(err)
			}
		}
		if claimed != c.claimed || missed != c.missed || !wrote.IsZero() != c.wrote || (c.wrote && !wrote.Equal(*c.at)) {
			t.Errorf("%s: claimed %v, missed %v, wrote %s", c.name, claimed, missed, wrote)
		}
	}
	// Sent before the client's partition, without the lean reads: the
	// placement's own claim.
	var claimed, missed bool
	var wrote time.Time
	if sts := l.ClaimOne(oneOf(id, now.Add(-40*time.Minute), &claimed, &missed, &wrote, 0, time.Time{})); len(sts) != 1 || sts[0].SQL != "CLAIM" {
		t.Errorf("sent before the partition: %+v", sts)
	}
	// With them (Citus): sealed read first, then the look-up from the time's
	// partition up to the client's, then the INSERT. Only a row inside the
	// client's partition, with sealed there and the ID not found, claims.
	l.routedSealed, l.routedLookup = routedLean("t", "m")
	inside := now.Add(5 * time.Minute)
	for _, c := range []struct {
		name                   string
		sealed                 bool
		found                  int64
		at                     time.Time
		claimed, missed, wrote bool
	}{
		{"sealed, not found, inside", true, 0, inside, true, false, false},
		{"not sealed yet", false, 0, inside, false, true, true},
		{"found before the partition", true, 1, inside, false, true, true},
		{"outside the partition", true, 0, now.Add(31 * time.Minute), false, true, true},
	} {
		var claimed, missed bool
		var wrote time.Time
		sts := l.ClaimOne(oneOf(id, now.Add(-100*time.Minute), &claimed, &missed, &wrote, 0, time.Time{}))
		if len(sts) != 3 || sts[2].SQL != "FRESH" || !strings.Contains(sts[0].SQL, "p.sealed = '2026-12-05 01:00:00+00'") ||
			!strings.Contains(sts[1].SQL, ">= '2026-12-04 23:00:00+00'::pg_catalog.timestamptz AND x.processed_at < '2026-12-05 01:00:00+00'") {
			t.Fatalf("%s: %+v, want the two reads and the INSERT", c.name, sts)
		}
		for i, v := range []any{c.sealed, c.found, c.at} {
			if err := sts[i].Row(func(dest ...any) error {
				switch d := dest[0].(type) {
				case *bool:
					*d = v.(bool)
				case *int64:
					*d = v.(int64)
				case *time.Time:
					*d = v.(time.Time)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		if claimed != c.claimed || missed != c.missed || !wrote.IsZero() != c.wrote || (c.wrote && !wrote.Equal(c.at)) {
			t.Errorf("%s: claimed %v, missed %v, wrote %s", c.name, claimed, missed, wrote)
		}
	}
	// Sent again: the placement's own claim, after the undo when a row was
	// written.
	undo := now.Add(31 * time.Minute)
	sts := l.ClaimOne(oneOf(id, now.Add(-10*time.Minute), &claimed, &missed, &wrote, 1, undo))
	if len(sts) != 2 || sts[0].SQL != "UNDO" || sts[1].SQL != "CLAIM" || !sts[0].Args[3].(time.Time).Equal(undo) {
		t.Errorf("sent again after a row was written: %+v", sts)
	}
}

func ptr[T any](v T) *T { return &v }

func shapeID() shape.ID {
	return shape.ID{Consumer: "c", ID: "m1", Key: "00000000-0000-0000-0000-000000000001"}
}

func oneOf(id shape.ID, since time.Time, claimed, missed *bool, wrote *time.Time, tried int, undo time.Time) shape.One {
	return shape.One{ID: id, Since: since, Claimed: claimed, Missed: missed, Wrote: wrote, Tried: tried, Undo: undo}
}
