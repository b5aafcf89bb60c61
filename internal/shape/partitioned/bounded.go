package partitioned

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/pgdedup/pgdedup/internal/shape"
	"github.com/pgdedup/pgdedup/internal/shape/plain"
)

// A bounded claim looks only where the ID can be. Its statement names two
// times as constants, so that the planner prunes every other partition
// before it locks any (PostgreSQL prunes on constants when it plans, for a
// generic plan too).
//
//   - The upper bound is the end of the partition after the client's
//     current one. Partitions created ahead lie past it. A claim never
//     looks in them, so they cost it nothing, however many there are.
//   - The lower bound is the start of the partition of shape.One.Since:
//     the message's first sending, less Config.SentAtMargin. No claim of
//     the ID can be older. It looks up the sealed partitions from there
//     on, and hands over through the unsealed ones from there on. Without
//     a time it is -infinity, and the claim looks everywhere, as before.
//
// A fresh claim is the cheapest. When the lower bound is the start of the
// client's current partition, no partition before it can hold the ID, so
// there is nothing to look up and nothing to hand over through, and the seal
// does not matter. The claim is one INSERT of the ID through the parent,
// stamped with the database's clock, which it writes only if that clock lies
// in the lower bound's partition. The statement is the plain table's, but
// for that condition. Inserting nothing says nothing more: the ID may be
// there, or the clock may lie elsewhere. So the claim then answers Missed,
// and the next claim tells the two apart.
//
// The client's clock only chooses the bounds. The database's clock still
// decides the partition, and the statement checks that it lies between
// them. If not, it writes nothing and answers so (shape.One.Missed), and
// the engine sends the claim again, guessing less: first the lean claim,
// then the bounded hand-over claim, then the claim without bounds
// (partitioned.go). The argument that a bounded claim is exact is in
// docs/partitioning.md ("Bounded claims").
//
// The insert goes through the parent table. PostgreSQL plans an INSERT
// into a partitioned table without locking its partitions, and opens only
// the one its row goes to.

// Bound placeholders in the templates of boundedClaims.
const (
	lowerMark = "{{lower}}"
	upperMark = "{{upper}}"
	// curMark and nextMark are the start and end of the client's current
	// partition.
	curMark  = "{{cur}}"
	nextMark = "{{next}}"
)

// boundedStored bounds the SELECT after a claim (plain.Statements'
// StoredFingerprint and StoredResult). Its renderKey variants are these.
const (
	boundedStored     = ` AND processed_at >= ` + lowerMark + ` AND processed_at < ` + upperMark
	storedFingerprint = -1
	storedResult      = -2
	// boundedStoredFresh bounds it after a fresh claim: the ID's row can be
	// only in the client's current partition.
	boundedStoredFresh = ` AND processed_at >= ` + lowerMark + ` AND processed_at < ` + nextMark
)

// boundedClaims returns the templates of the claims of one ID, by variant
// as claimWith: the fresh ones, the lean ones, then the bounded ones. The
// fresh ones answer the rows they inserted. The others answer one row: how
// many rows their last insert took (0 or 1), and whether the guess held.
// The lean claim guesses that the database's clock lies in the client's
// current partition and no partition before it waits to be sealed, which
// is so but for the moments after a switch. Then it is one look-up in the
// sealed partitions within the bounds and one insert. The bounded claim guesses only that the database's clock lies
// within the bounds, and hands over as the claim without bounds does.
func boundedClaims(t, meta, cols string, m plain.Statements) (fresh, lean, bounded *[4]string) {
	return freshClaims(t, cols, m), leanClaims(t, meta, cols, m), fullClaims(t, meta, cols, m)
}

// freshClaims are the fresh claims by variant. They insert the ID if the
// database's clock lies in the client's current partition, which starts at
// the lower bound.
func freshClaims(t, cols string, m plain.Statements) *[4]string {
	var out [4]string
	for v := range out {
		exp, cols, values := variantSQL(v, cols, m)
		out[v] = `INSERT INTO ` + t + cols + `
SELECT $3::uuid, $1::text, $2::text, c.t, ` + exp + values + `
FROM (SELECT pg_catalog.clock_timestamp() AS t) c WHERE c.t >= ` + lowerMark + ` AND c.t < ` + nextMark + `
ON CONFLICT DO NOTHING`
	}
	return &out
}

// variantSQL returns the expires_at expression, the extra column list and
// the extra values of a claim of variant v.
func variantSQL(v int, cols string, m plain.Statements) (string, string, string) {
	values, exp, n := "", m.Expires, 4
	if v&plain.ClaimRetention != 0 {
		exp = fmt.Sprintf("now() + $%d::bigint * interval '1 microsecond'", n)
		n++
	}
	if v&plain.ClaimFingerprint != 0 {
		cols = strings.TrimSuffix(cols, ")") + ", fingerprint)"
		values = fmt.Sprintf(", $%d::bytea", n)
	}
	return exp, cols, values
}

// leanClaims are the lean claims by variant. m holds the clock, read once.
// ok says that the clock's partition is the client's current one, and
// sealed is where it starts. The look-up then covers the partitions from
// the lower bound to the client's current one, both constants, so the
// planner keeps only those.
func leanClaims(t, meta, cols string, m plain.Statements) *[4]string {
	var out [4]string
	for v := range out {
		exp, cols, values := variantSQL(v, cols, m)
		out[v] = `WITH m AS MATERIALIZED (
SELECT c.t, coalesce(p.sealed = pg_catalog.date_bin(p.span, c.t, ` + Origin + `) AND p.sealed = ` + curMark + `, false) AS ok
FROM (SELECT pg_catalog.clock_timestamp() AS t) c LEFT JOIN ` + meta + ` p ON p.parent = '` + t + `'::pg_catalog.regclass),
last AS (
INSERT INTO ` + t + cols + `
SELECT $3::uuid, $1::text, $2::text, m.t, ` + exp + values + ` FROM m WHERE m.ok
AND NOT EXISTS (SELECT 1 FROM ` + t + ` x WHERE x.key = $3::uuid AND x.consumer = $1 AND x.message_id = $2
AND x.processed_at >= ` + lowerMark + ` AND x.processed_at < ` + curMark + `)
ON CONFLICT DO NOTHING RETURNING 1)
SELECT (SELECT count(*) FROM last), (SELECT ok FROM m)`
	}
	return &out
}

// fullClaims are the bounded claims by variant.
func fullClaims(t, meta, cols string, m plain.Statements) *[4]string {
	var out [4]string
	// Inside the bounds: the database's current partition starts at or
	// after the lower bound, and before the upper one.
	head := headSQL(t, meta, "GREATEST(m.sealed, "+lowerMark+")") + `ok AS MATERIALIZED (
SELECT coalesce(m.lo >= ` + lowerMark + ` AND m.lo < ` + upperMark + `, false) AS inside FROM m),
`
	within := ` AND x.processed_at >= ` + lowerMark + ` AND x.processed_at < ` + upperMark
	for v := range out {
		exp, cols, values := variantSQL(v, cols, m)
		out[v] = head + `seen AS MATERIALIZED (
SELECT EXISTS (SELECT 1 FROM ` + t + ` x WHERE x.key = $3::uuid AND x.consumer = $1 AND x.message_id = $2
AND x.processed_at < (SELECT sealed FROM m)` + within + `)
OR EXISTS (SELECT 1 FROM ` + t + ` x WHERE (SELECT count(*) FROM h) > 1 AND x.key = $3::uuid AND x.consumer = $1 AND x.message_id = $2
AND x.processed_at >= (SELECT sealed FROM m)` + within + `) AS found),
older AS (
INSERT INTO ` + t + cols + `
SELECT $3::uuid, $1::text, $2::text, h.g, ` + exp + values + ` FROM h WHERE (SELECT inside FROM ok) AND NOT (SELECT found FROM seen) ORDER BY h.g
ON CONFLICT DO NOTHING RETURNING 1),
last AS (
INSERT INTO ` + t + cols + `
SELECT $3::uuid, $1::text, $2::text, m.at, ` + exp + values + ` FROM m
WHERE (SELECT inside FROM ok) AND NOT (SELECT found FROM seen) AND (SELECT count(*) FROM older) = (SELECT count(*) FROM h)
ON CONFLICT DO NOTHING RETURNING 1)
SELECT (SELECT count(*) FROM last), (SELECT inside FROM ok)`
	}
	return &out
}

// claimBounded returns the bounded claim of c, or nil where c or the table
// has none: c takes no answer of Missed, the placement claims in its own
// way, or the span is not known.
func (l *Shape) claimBounded(c shape.One) []shape.Statement {
	if c.Missed == nil || l.boundWith == nil || l.span <= 0 {
		return nil
	}
	v := 0
	if c.Retention != 0 {
		v |= plain.ClaimRetention
	}
	if c.Fingerprint != nil {
		v |= plain.ClaimFingerprint
	}
	now := l.clock()
	tmpls, kind := l.boundWith, bounded
	switch {
	case c.Tried > 0:
	case !c.Since.IsZero() && spanStart(c.Since, l.span).Equal(spanStart(now, l.span)):
		tmpls, kind = l.freshWith, fresh
	default:
		tmpls, kind = l.leanWith, lean
	}
	var sqls [4]string
	sqls[v] = l.render(tmpls[v], renderKey{kind: kind, variant: v}, c.Since, now)
	// The SELECT that reads the row back for a fingerprint or a result is
	// bounded alike: the ID's rows lie within the bounds.
	stored, bound := l.sql, boundedStored
	if kind == fresh {
		bound = boundedStoredFresh
	}
	switch {
	case c.WithResult:
		stored.StoredResult = l.render(l.sql.StoredResult+bound, renderKey{kind: kind, variant: storedResult}, c.Since, now)
	case c.Fingerprint != nil:
		stored.StoredFingerprint = l.render(l.sql.StoredFingerprint+bound, renderKey{kind: kind, variant: storedFingerprint}, c.Since, now)
	}
	sts := plain.ClaimOneWith(c, stored, sqls)
	claimed, missed := c.Claimed, c.Missed
	if kind == fresh {
		sts[0].Affected = func(n int64) { *claimed, *missed = n == 1, n != 1 }
		return sts
	}
	sts[0].Affected = nil
	sts[0].Row = func(scan func(dest ...any) error) error {
		var n int64
		var inside bool
		err := scan(&n, &inside)
		*claimed, *missed = n == 1, !inside
		return err
	}
	return sts
}

// rendered are the statements of bounded claims for one upper bound, by
// what else they depend on. A claim renders its statement once per span
// and kind, not once per call.
type rendered struct {
	upper time.Time
	sqls  sync.Map // renderKey → string
}

// The kinds of bounded claim of one ID, from the most guessing.
const (
	bounded = iota
	lean
	fresh
	// The reads of a lean routed claim (claimRouted).
	routedSealed
	routedLookup
)

// renderKey is what a rendered statement depends on besides the upper
// bound.
type renderKey struct {
	batch   bool
	kind    int // of a claim of one ID
	variant int
	lower   time.Time // zero: -infinity
}

// render returns tmpl with the bounds of a claim made at now on the
// client's clock: the start of since's partition, or -infinity if since is
// zero, and the end of the partition after now's (the end of now's for
// nextMark).
func (l *Shape) render(tmpl string, key renderKey, since, now time.Time) string {
	upper := spanStart(now, l.span).Add(2 * l.span)
	if !since.IsZero() {
		key.lower = spanStart(since, l.span)
	}
	r := l.rendered.Load()
	if r == nil || !r.upper.Equal(upper) {
		r = &rendered{upper: upper}
		l.rendered.Store(r)
	}
	if s, ok := r.sqls.Load(key); ok {
		return s.(string)
	}
	lower := `'-infinity'::pg_catalog.timestamptz`
	if !key.lower.IsZero() {
		lower = timestampLiteral(key.lower)
	}
	s := strings.NewReplacer(lowerMark, lower, upperMark, timestampLiteral(upper),
		nextMark, timestampLiteral(upper.Add(-l.span)), curMark, timestampLiteral(upper.Add(-2*l.span))).Replace(tmpl)
	r.sqls.Store(key, s)
	return s
}

// origin is Origin as a time.
var origin = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// spanStart is date_bin(span, t, Origin): the start of the partition that
// holds t.
func spanStart(t time.Time, span time.Duration) time.Time {
	d := t.Sub(origin)
	n := d / span
	if d < 0 && d%span != 0 {
		n--
	}
	return origin.Add(n * span)
}

// timestampLiteral is t as a timestamptz constant, in UTC to the
// microsecond.
func timestampLiteral(t time.Time) string {
	return `'` + t.UTC().Format("2006-01-02 15:04:05.999999") + `+00'::pg_catalog.timestamptz`
}

// boundedBatch is the template of the bounded claim of many IDs: the claim
// of many IDs without bounds (partitioned.go), with the upper bound. It
// answers the IDs it inserted, and a NULL if the database's clock lay past
// the upper bound. Its lower bound is the batch's time (shape.Many.Since),
// or -infinity without one.
func boundedBatch(t, meta, cols string, m plain.Statements) string {
	within := ` AND x.processed_at >= ` + lowerMark + ` AND x.processed_at < ` + upperMark
	return headSQL(t, meta, "GREATEST(m.sealed, "+lowerMark+")") + `ok AS MATERIALIZED (
SELECT coalesce(m.lo >= ` + lowerMark + ` AND m.lo < ` + upperMark + `, false) AS inside FROM m),
ids AS MATERIALIZED (SELECT k, id, n FROM unnest($3::uuid[], $2::text[]) WITH ORDINALITY AS u(k, id, n)),
seen AS MATERIALIZED (
SELECT x.key FROM ` + t + ` x WHERE x.key = ANY ($3::uuid[]) AND x.processed_at < (SELECT sealed FROM m)` + within + `
UNION ALL
SELECT x.key FROM ` + t + ` x WHERE (SELECT count(*) FROM h) > 1 AND x.key = ANY ($3::uuid[]) AND x.processed_at >= (SELECT sealed FROM m)` + within + `),
older AS (
INSERT INTO ` + t + cols + `
SELECT ids.k, $1::text, ids.id, h.g, ` + m.Expires + ` FROM h, ids WHERE (SELECT inside FROM ok) AND ids.k NOT IN (SELECT key FROM seen) ORDER BY h.g, ids.n
ON CONFLICT DO NOTHING RETURNING key),
won AS (SELECT key FROM older GROUP BY key HAVING count(*) = (SELECT count(*) FROM h)),
last AS (
INSERT INTO ` + t + cols + `
SELECT ids.k, $1::text, ids.id, m.at, ` + m.Expires + ` FROM m, ids
WHERE (SELECT inside FROM ok) AND ids.k NOT IN (SELECT key FROM seen) AND ((SELECT count(*) FROM h) = 0 OR ids.k IN (SELECT key FROM won))
ORDER BY ids.n
ON CONFLICT DO NOTHING
RETURNING message_id)
SELECT message_id FROM last
UNION ALL
SELECT NULL WHERE NOT (SELECT inside FROM ok)`
}

// claimManyBounded returns the bounded claim of c's IDs, or nil where c or
// the table has none (as claimBounded).
func (l *Shape) claimManyBounded(c shape.Many) []shape.Statement {
	if c.Missed == nil || l.boundBatch == "" || l.span <= 0 {
		return nil
	}
	sql := l.render(l.boundBatch, renderKey{batch: true}, c.Since, l.clock())
	fresh, missed := c.Fresh, c.Missed
	return []shape.Statement{{SQL: sql, Args: []any{c.Consumer, c.IDs, c.Keys}, Row: func(scan func(dest ...any) error) error {
		var id *string
		if err := scan(&id); err != nil {
			return err
		}
		if id == nil {
			*missed = true
			return nil
		}
		return fresh(func(dest ...any) error {
			*dest[0].(*string) = *id
			return nil
		})
	}}}
}

// claimRouted returns the placement's claim of c as statements it routes
// (Claims.Fresh), or nil where c or the table has none. It is sent where
// the statements of a fresh or lean claim cannot be (on Citus: an INSERT …
// SELECT is pulled through the coordinator). It inserts the ID into the
// partition of the database's clock, whichever that is, and returns the
// row's processed_at. Inserting nothing is a conflict: the ID was claimed,
// a duplicate. A row inside the client's current partition, where the
// lower bound lies, is the fresh claim of bounded.go.
//
// When the lower bound lies before the client's current partition, the
// INSERT comes after two reads, as the lean claim's one statement makes
// them: whether sealed is the start of the client's current partition, and
// then whether the ID is in the partitions from the lower bound up to it.
// The look-up's snapshot is taken after the read of sealed. So if sealed
// was there, every claim that could write into those partitions had
// ended before the look-up (cleanup.go's sealPartitions), and the look-up
// sees its rows. A row inside the client's current partition, sealed there
// and the ID not found, is the lean claim.
//
// Any other row is a guess that missed: the clock outside that partition,
// a partition before it not sealed yet, or the ID found before it (a
// duplicate, told apart by the claim sent again). The claim missed, but
// wrote. It sets c.Wrote, and the claim sent again deletes that row first
// (shape.One.Undo). The row is this transaction's own and uncommitted, so
// no other claim has seen it but as a lock to wait for. Deleted, it is as
// if never written.
func (l *Shape) claimRouted(c shape.One) []shape.Statement {
	if l.routedFresh == nil || c.Missed == nil || c.Wrote == nil || c.Tried > 0 || c.Since.IsZero() || l.span <= 0 {
		return nil
	}
	now := l.clock()
	cur, lower := spanStart(now, l.span), spanStart(c.Since, l.span)
	var pre []shape.Statement
	sealed, found := true, false
	switch {
	case lower.Equal(cur):
	case lower.Before(cur) && l.routedLookup != "":
		sealed = false
		pre = []shape.Statement{
			{SQL: l.render(l.routedSealed, renderKey{kind: routedSealed}, time.Time{}, now), Row: func(scan func(dest ...any) error) error {
				return scan(&sealed)
			}},
			{SQL: l.render(l.routedLookup, renderKey{kind: routedLookup}, c.Since, now), Args: c.Args(), Row: func(scan func(dest ...any) error) error {
				var n int64
				err := scan(&n)
				found = n > 0
				return err
			}},
		}
	default:
		return nil
	}
	sts := append(pre, plain.ClaimOneWith(c, l.sql, *l.routedFresh)...)
	claimed, missed, wrote, span := c.Claimed, c.Missed, c.Wrote, l.span
	i := len(pre) // the INSERT
	sts[i].Affected = nil
	sts[i].Row = func(scan func(dest ...any) error) error {
		var at time.Time
		if err := scan(&at); err != nil {
			return err
		}
		if spanStart(at, span).Equal(cur) && sealed && !found {
			*claimed = true
			return nil
		}
		*missed, *wrote = true, at
		return nil
	}
	return sts
}

// routedLean returns the reads of a lean routed claim of table t with meta
// (claimRouted): whether sealed is the start of the client's current
// partition, and how many rows the ID has from the lower bound up to it.
func routedLean(t, meta string) (sealed, lookup string) {
	sealed = `SELECT coalesce((SELECT p.sealed = ` + curMark + ` FROM ` + meta + ` p WHERE p.parent = '` + t + `'::pg_catalog.regclass), false)`
	lookup = `SELECT count(*) FROM ` + t + ` x WHERE x.key = $3::uuid AND x.consumer = $1 AND x.message_id = $2
AND x.processed_at >= ` + lowerMark + ` AND x.processed_at < ` + curMark
	return sealed, lookup
}
