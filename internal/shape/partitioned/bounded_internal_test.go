package partitioned

import (
	"strings"
	"testing"
	"time"
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
