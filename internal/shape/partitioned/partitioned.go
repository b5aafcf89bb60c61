// Package partitioned is the partitioned shape of the dedup table
// (Config.Layout = Partitioned, made by Store.Setup). processed_messages is
// partitioned by RANGE on processed_at, the database's clock at claim time.
// Each partition covers one span (Retention ÷ Partitions), with a unique
// index on key and an index on expires_at. A claim writes to the current
// partition, whose index spans minutes or hours, not the Retention. Old IDs
// are forgotten by dropping whole partitions (cleanup.go).
//
// PostgreSQL enforces uniqueness per partition only, so claims follow a
// hand-over protocol. docs/partitioning.md has the argument in full.
//
//   - The table's row in pgdedup_partitions holds its span and sealed. Every
//     partition ending at or before sealed is sealed.
//   - A claim reads the clock (clock_timestamp(), once) and sealed. It looks
//     the key up in the sealed partitions. It inserts it, ON CONFLICT DO
//     NOTHING, into every unsealed partition older than the current one
//     (oldest first), and then into the current one if all of those took
//     it. It is new only if the last insert took it. A conflict anywhere
//     makes it a duplicate.
//   - Cleanup seals the partitions before the current one once every
//     transaction that held a lock on the table when it looked has ended.
//     It looks after the current partition began. This is how CREATE INDEX
//     CONCURRENTLY waits for old transactions. A claim locks the table
//     before it reads the clock. So every claim that chose a partition as
//     current has ended before that partition is sealed. A claim that sees
//     the seal has a later snapshot and sees their rows. Two claims that do
//     not see the same seal share at least one unsealed partition. Its
//     unique index makes the second wait for the first and then skip.
//
// A placement that distributes the table (package citus) keeps the same
// argument with hooks of its own (see Placement).
package partitioned

import (
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup/internal/shape"
	"github.com/pgdedup/pgdedup/internal/shape/plain"
)

// Config is what the partitioned shape is built from.
type Config struct {
	Env shape.Env
	SQL plain.Statements // the plain table's statements
	// Meta is the quoted pgdedup_partitions beside the table (MetaName).
	Meta  string
	Place Placement
	// Waits and Move are the Store's, which tests set.
	Waits *Waits
	Move  *MoveTimes
	// Runway is how far ahead of the current partition Cleanup keeps
	// partitions created (Config.Runway, its default applied).
	Runway time.Duration
	// Span is the table's span as found in pgdedup_partitions, or zero if
	// unknown. Clock is the client's clock (time.Now unless a test sets it).
	Span  time.Duration
	Clock func() time.Time
	// Pool or Conn is Env.DB when it is one, for a statement that needs a
	// connection of its own (execAlone).
	Pool *pgxpool.Pool
	Conn *pgx.Conn
}

// Shape is processed_messages partitioned by claim time, on its placement.
type Shape struct {
	Placement
	db        shape.DB
	log       *slog.Logger
	table     string
	meta      string
	retention time.Duration
	waits     *Waits
	move      *MoveTimes
	pool      *pgxpool.Pool
	conn      *pgx.Conn
	sql       plain.Statements

	// claimWith are the claims of one ID by variant, as in plain.Statements:
	// $1 consumer, $2 id, $3 key, then $4 the retention in microseconds and
	// the fingerprint.
	claimWith  [4]string
	claimBatch string // $1 consumer, $2 ids, $3 their keys, sorted by key
	lookupSQL  string // $1 consumer, $2 id, $3 key: the newest row
	// freshWith, leanWith and boundWith are the claims of one ID that guess,
	// by variant (bounded.go), or nil where the placement has claims of its
	// own.
	freshWith, leanWith, boundWith *[4]string
	boundBatch                     string // the bounded claim of many IDs, or "" (bounded.go)
	// runway is Config.Runway (AheadFor).
	runway time.Duration
	// span is the table's span, read when the Store first found the table
	// partitioned, or zero if unknown. Bounded claims need it.
	span time.Duration
	// clock is the client's clock, which tests set.
	clock func() time.Time
	// rendered caches the bounded claims' statements (bounded.go).
	rendered atomic.Pointer[rendered]
	// counted is set when a claim of one ID returns the count of IDs it
	// inserted as a row, instead of the rows it affected.
	counted bool
	// since is set when the placement's claims take the claim's time, last
	// (Claims.Since).
	since bool
	// routedFresh and undo are the placement's Claims.Fresh and
	// Claims.Undo. With routedFresh, routedSealed and routedLookup are the
	// statements of a lean routed claim (claimRouted).
	routedFresh                *[4]string
	undo                       string
	routedSealed, routedLookup string
}

// noStrayCopies: a duplicate must not leave a copy of its ID behind. One
// INSERT puts the ID into every unsealed partition before the current one,
// and a conflict in one of them does not stop the rows for the others. With
// two or more of them (no seal for two spans), a duplicate whose first claim
// is in the oldest would add a copy to the newer ones. That copy carries the
// duplicate's fingerprint and no stored result, and it stays when the
// caller's transaction commits (TestPartitionedDuplicateLeavesNoCopies). So
// claims then look the ID up in the unsealed partitions too, and insert
// nothing if it is there. A duplicate running beside its first claim can
// still add a copy, because it cannot see that claim's rows. The reads after
// a claim cannot tell such a copy from the first claim's rows. Ordering them
// by xmin would need SELECT on the whole table, which the HTTP role's column
// grants do not give.

// Origin is where partition spans are counted from. Partitions start at
// whole multiples of the span after it (date_bin's origin).
const Origin = `'2000-01-01 00:00:00+00'::pg_catalog.timestamptz`

// ClaimLockClass is the first half of an advisory lock that claims on Citus
// held before this release ("pgde"). The second is the table's OID. Sealing
// still waits for its holders as for the table's lockers, for claims still
// running the function of an earlier release during an upgrade.
const ClaimLockClass = "1885824101"

// MetaName returns the quoted name of the table of partitioned tables
// beside table: pgdedup_partitions, in table's schema if it names one.
func MetaName(table pgx.Identifier) string {
	if len(table) == 2 {
		return pgx.Identifier{table[0], "pgdedup_partitions"}.Sanitize()
	}
	return pgx.Identifier{"pgdedup_partitions"}.Sanitize()
}

// New returns the partitioned shape of c.Env's table.
func New(c Config) *Shape {
	m := c.SQL
	t := m.Table
	l := &Shape{Placement: c.Place, db: c.Env.DB, log: c.Env.Log, table: t, meta: c.Meta, retention: c.Env.Retention,
		waits: c.Waits, move: c.Move, pool: c.Pool, conn: c.Conn, sql: m, span: c.Span, clock: c.Clock, runway: c.Runway}
	if l.clock == nil {
		l.clock = time.Now
	}
	head := headSQL(t, c.Meta, "m.sealed")
	cols := ` (key, consumer, message_id, processed_at, expires_at)`
	// The same for many keys. Rows go in (partition, key) order, older
	// partitions first. Every claim takes its rows' locks in that one order,
	// so overlapping batches cannot deadlock.
	l.claimBatch = head + `ids AS MATERIALIZED (SELECT k, id, n FROM unnest($3::uuid[], $2::text[]) WITH ORDINALITY AS u(k, id, n)),
seen AS MATERIALIZED (
SELECT x.key FROM ` + t + ` x WHERE x.key = ANY ($3::uuid[]) AND x.processed_at < (SELECT sealed FROM m)
UNION ALL
SELECT x.key FROM ` + t + ` x WHERE (SELECT count(*) FROM h) > 1 AND x.key = ANY ($3::uuid[]) AND x.processed_at >= (SELECT sealed FROM m)),
older AS (
INSERT INTO ` + t + cols + `
SELECT ids.k, $1::text, ids.id, h.g, ` + m.Expires + ` FROM h, ids WHERE ids.k NOT IN (SELECT key FROM seen) ORDER BY h.g, ids.n
ON CONFLICT DO NOTHING RETURNING key),
won AS (SELECT key FROM older GROUP BY key HAVING count(*) = (SELECT count(*) FROM h))
INSERT INTO ` + t + cols + `
SELECT ids.k, $1::text, ids.id, m.at, ` + m.Expires + ` FROM m, ids
WHERE ids.k NOT IN (SELECT key FROM seen) AND ((SELECT count(*) FROM h) = 0 OR ids.k IN (SELECT key FROM won))
ORDER BY ids.n
ON CONFLICT DO NOTHING
RETURNING message_id`
	// Hand-over copies carry the start of their partition as processed_at.
	// So the newest row is the claim's own.
	l.lookupSQL = `SELECT processed_at, expires_at FROM ` + t + ` WHERE key = $3::uuid AND consumer = $1 AND message_id = $2
ORDER BY processed_at DESC LIMIT 1`
	for v := range l.claimWith {
		cols, values, exp, n := cols, "", m.Expires, 4
		if v&plain.ClaimRetention != 0 {
			exp = fmt.Sprintf("now() + $%d::bigint * interval '1 microsecond'", n)
			n++
		}
		if v&plain.ClaimFingerprint != 0 {
			cols = strings.TrimSuffix(cols, ")") + ", fingerprint)"
			values = fmt.Sprintf(", $%d::bytea", n)
		}
		// The sealed partitions are looked up, and the Append prunes the
		// others at run time. The unsealed ones are inserted into, oldest
		// first. The current one comes last, and only when every older one
		// took the key. With two or more unsealed partitions before the
		// current one (no seal for two spans), the unsealed ones are looked
		// up too (see noStrayCopies).
		l.claimWith[v] = head + `seen AS MATERIALIZED (
SELECT EXISTS (SELECT 1 FROM ` + t + ` x WHERE x.key = $3::uuid AND x.consumer = $1 AND x.message_id = $2
AND x.processed_at < (SELECT sealed FROM m))
OR EXISTS (SELECT 1 FROM ` + t + ` x WHERE (SELECT count(*) FROM h) > 1 AND x.key = $3::uuid AND x.consumer = $1 AND x.message_id = $2
AND x.processed_at >= (SELECT sealed FROM m)) AS found),
older AS (
INSERT INTO ` + t + cols + `
SELECT $3::uuid, $1::text, $2::text, h.g, ` + exp + values + ` FROM h WHERE NOT (SELECT found FROM seen) ORDER BY h.g
ON CONFLICT DO NOTHING RETURNING 1)
INSERT INTO ` + t + cols + `
SELECT $3::uuid, $1::text, $2::text, m.at, ` + exp + values + ` FROM m
WHERE NOT (SELECT found FROM seen) AND (SELECT count(*) FROM older) = (SELECT count(*) FROM h)
ON CONFLICT DO NOTHING`
	}
	l.freshWith, l.leanWith, l.boundWith = boundedClaims(t, c.Meta, cols, m)
	l.boundBatch = boundedBatch(t, c.Meta, cols, m)
	if cl := c.Place.Claims(m, c.Meta); cl != nil {
		l.claimWith, l.claimBatch, l.counted, l.freshWith, l.leanWith, l.boundWith, l.boundBatch = cl.One, cl.Batch, true, nil, nil, nil, ""
		l.since, l.routedFresh, l.undo = cl.Since, cl.Fresh, cl.Undo
		if cl.Fresh != nil {
			l.routedSealed, l.routedLookup = routedLean(t, c.Meta)
		}
	}
	return l
}

// headSQL is the start of every claim statement of table t with meta, the
// table's pgdedup_partitions, up to its CTE h. from is where h starts: the
// sealed partitions end (m.sealed), or later for a bounded claim.
//
// m is the clock, read once, the span, sealed, and the start of the
// current partition. at is the clock again, or NULL without the table's
// row in pgdedup_partitions. The claim then fails (no partition for
// NULL) instead of reporting a duplicate. h is the start of every
// unsealed partition before the current one. Usually there is none, or
// one just after a switch.
func headSQL(t, meta, from string) string {
	return `WITH m AS MATERIALIZED (
SELECT p.span, p.sealed, pg_catalog.date_bin(p.span, c.t, ` + Origin + `) AS lo,
CASE WHEN p.span IS NOT NULL THEN c.t END AS at
FROM (SELECT pg_catalog.clock_timestamp() AS t) c LEFT JOIN ` + meta + ` p ON p.parent = '` + t + `'::pg_catalog.regclass),
h AS MATERIALIZED (SELECT g FROM m, pg_catalog.generate_series(` + from + `, m.lo - m.span, m.span) g),
`
}

// ClaimOne is the hand-over claim. A SELECT follows it for a fingerprint or
// a stored result, as on the plain table. All copies of a claim carry the
// same values.
func (l *Shape) ClaimOne(c shape.One) []shape.Statement {
	if sts := l.claimBounded(c); sts != nil {
		return sts
	}
	if sts := l.claimRouted(c); sts != nil {
		return sts
	}
	var undo []shape.Statement
	if !c.Undo.IsZero() && l.undo != "" {
		undo = []shape.Statement{{SQL: l.undo, Args: append(c.Args(), c.Undo)}}
	}
	sts := append(undo, plain.ClaimOneWith(c, l.sql, l.claimWith)...)
	i := len(undo) // the claim
	if l.since {
		sts[i].Args = append(sts[i].Args, sinceArg(c.Since))
	}
	if l.counted {
		claimed := c.Claimed
		sts[i].Affected = nil
		sts[i].Row = func(scan func(dest ...any) error) error {
			var n int64
			err := scan(&n)
			*claimed = n == 1
			return err
		}
	}
	return sts
}

// StoreResult updates every copy of the ID's row.
func (l *Shape) StoreResult(id shape.ID, result []byte) shape.Statement {
	return shape.Statement{SQL: l.sql.StoreResult, Args: append(id.Args(), result)}
}

// Lookup reads the newest row of the ID.
func (l *Shape) Lookup(id shape.ID, row shape.RowFunc) shape.Statement {
	return shape.Statement{SQL: l.lookupSQL, Args: id.Args(), Row: row}
}

// Delete deletes every copy of the ID's row.
func (l *Shape) Delete(id shape.ID, affected func(int64)) shape.Statement {
	return shape.Statement{SQL: l.sql.Forget, Args: id.Args(), Affected: affected}
}

// ClaimMany is the hand-over claim of many keys.
func (l *Shape) ClaimMany(c shape.Many) []shape.Statement {
	if sts := l.claimManyBounded(c); sts != nil {
		return sts
	}
	args := []any{c.Consumer, c.IDs, c.Keys}
	if l.since {
		args = append(args, sinceArg(c.Since))
	}
	return []shape.Statement{{SQL: l.claimBatch, Args: args, Row: c.Fresh}}
}

// sinceArg is since as a claim's argument: NULL if zero.
func sinceArg(since time.Time) any {
	if since.IsZero() {
		return nil
	}
	return since
}

// Transient explains a claim that finds no partition for its time, and
// marks it as one a later attempt cures (ActionFor). That happens when no
// cleaner ran for several spans, or Setup was not run.
func (l *Shape) Transient(err error) error {
	if code, _ := shape.SQLState(err); code == "23514" && strings.Contains(err.Error(), "no partition") {
		return &shape.CurableError{Err: fmt.Errorf("%w (partitions are created ahead by Cleanup: run RunCleaner or `pgdedup cleanup` at least every partition span; "+
			"see docs/partitioning.md)", err)}
	}
	return l.Placement.Transient(err)
}
