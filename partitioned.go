package pgdedup

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The partitioned layout (Config.Layout = Partitioned, made by Store.Setup):
// processed_messages partitioned by RANGE on processed_at, the database's
// clock at claim time, each partition one span (Retention ÷ Partitions) with a
// unique index on key and an index on expires_at. A claim writes to the
// current partition, whose index spans minutes or hours, not the Retention;
// old IDs are forgotten by dropping whole partitions (partition_cleanup.go).
//
// PostgreSQL enforces uniqueness per partition only, so claims follow a
// hand-over protocol (docs/partitioning.md has the argument in full):
//
//   - The table's row in pgdedup_partitions holds its span and sealed: every
//     partition ending at or before sealed is sealed.
//   - A claim reads the clock (clock_timestamp(), once) and sealed, looks the
//     key up in the sealed partitions, and inserts it, ON CONFLICT DO NOTHING,
//     into every unsealed partition older than the current one (oldest first)
//     and then, if all of those took it, into the current one. It is new only
//     if the last insert took it: a conflict anywhere makes it a duplicate.
//   - Cleanup seals the partitions before the current one once every
//     transaction that held a lock on the table when it looked (after the
//     current partition began) has ended, as CREATE INDEX CONCURRENTLY waits
//     for old transactions. A claim locks the table before it reads the clock,
//     so every claim that chose a partition as current has committed or rolled
//     back before that partition is sealed: a claim that sees the seal (its
//     snapshot is later) sees their rows. Two claims that do not see the same
//     seal share at least one unsealed partition, whose unique index makes
//     the second wait for the first and then skip.
//
// On Citus (newCitusPartitionedLayout) the same holds with the claim's
// shared advisory lock on the coordinator for its lock on the table: the
// claim takes it before it reads the coordinator's clock, sealing lists and
// waits for its holders as for the table's lockers, and Citus commits (or
// prepares and commits) a transaction's shards before the coordinator
// releases its locks. A claim that sees a seal reads the shard afterwards,
// and so sees the rows of every claim sealing waited for. A two-phase commit
// whose COMMIT PREPARED failed keeps its rows prepared, invisible, after the
// coordinator let go: sealing also waits for the transactions prepared on
// the nodes that hold a lock on the table's shards (partition_prepared.go).

// partitionedLayout is processed_messages partitioned by claim time, on one
// PostgreSQL server or distributed by Citus (placement says which).
type partitionedLayout struct {
	placement
	// claimWith are the claims of one ID by claimVariant, as in
	// messageStatements: $1 consumer, $2 id, $3 key, then $4 the retention
	// in microseconds and/or the fingerprint.
	claimWith  [4]string
	claimBatch string // $1 consumer, $2 ids, $3 their keys, sorted by key
	lookupSQL  string // $1 consumer, $2 id, $3 key: the newest row
	citus      bool   // claimWith and claimBatch call the Citus claim function
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
// still add a copy, because it cannot see that claim's rows. The reads that
// follow a claim (storedFingerprint, storedResult) cannot tell such a copy
// from the first claim's rows: ordering by xmin would need SELECT on the
// whole table, which the HTTP role's column grants do not give.

// partitionOrigin is where partition spans are counted from: partitions
// start at whole multiples of the span after it (date_bin's origin).
const partitionOrigin = `'2000-01-01 00:00:00+00'::pg_catalog.timestamptz`

// partitionMeta returns the quoted name of the table of partitioned tables
// beside table: pgdedup_partitions, in table's schema if it names one.
func partitionMeta(table pgx.Identifier) string {
	if len(table) == 2 {
		return pgx.Identifier{table[0], "pgdedup_partitions"}.Sanitize()
	}
	return pgx.Identifier{"pgdedup_partitions"}.Sanitize()
}

func newPartitionedLayout(m messageStatements, meta string) partitionedLayout {
	t := m.table
	// m: the clock, read once, the span, sealed, and the start of the current
	// partition; at is the clock again, or NULL without the table's row in
	// pgdedup_partitions, so that the claim fails (no partition for NULL)
	// instead of reporting a duplicate. h: the start of every unsealed
	// partition before the current one, usually none, or one just after a
	// switch.
	head := `WITH m AS MATERIALIZED (
SELECT p.span, p.sealed, pg_catalog.date_bin(p.span, c.t, ` + partitionOrigin + `) AS lo,
CASE WHEN p.span IS NOT NULL THEN c.t END AS at
FROM (SELECT pg_catalog.clock_timestamp() AS t) c LEFT JOIN ` + meta + ` p ON p.parent = '` + t + `'::pg_catalog.regclass),
h AS MATERIALIZED (SELECT g FROM m, pg_catalog.generate_series(m.sealed, m.lo - m.span, m.span) g),
`
	cols := ` (key, consumer, message_id, processed_at, expires_at)`
	l := partitionedLayout{
		placement: plainPlacement(m.lockTimeoutMS),
		// The same for many keys. Rows go in (partition, key) order, older
		// partitions first: every claim takes its rows' locks in that one
		// order, so overlapping batches cannot deadlock.
		claimBatch: head + `ids AS MATERIALIZED (SELECT k, id, n FROM unnest($3::uuid[], $2::text[]) WITH ORDINALITY AS u(k, id, n)),
seen AS MATERIALIZED (
SELECT x.key FROM ` + t + ` x WHERE x.key = ANY ($3::uuid[]) AND x.processed_at < (SELECT sealed FROM m)
UNION ALL
SELECT x.key FROM ` + t + ` x WHERE (SELECT count(*) FROM h) > 1 AND x.key = ANY ($3::uuid[]) AND x.processed_at >= (SELECT sealed FROM m)),
older AS (
INSERT INTO ` + t + cols + `
SELECT ids.k, $1::text, ids.id, h.g, ` + m.expires + ` FROM h, ids WHERE ids.k NOT IN (SELECT key FROM seen) ORDER BY h.g, ids.n
ON CONFLICT DO NOTHING RETURNING key),
won AS (SELECT key FROM older GROUP BY key HAVING count(*) = (SELECT count(*) FROM h))
INSERT INTO ` + t + cols + `
SELECT ids.k, $1::text, ids.id, m.at, ` + m.expires + ` FROM m, ids
WHERE ids.k NOT IN (SELECT key FROM seen) AND ((SELECT count(*) FROM h) = 0 OR ids.k IN (SELECT key FROM won))
ORDER BY ids.n
ON CONFLICT DO NOTHING
RETURNING message_id`,
		// Hand-over copies carry the start of their partition as
		// processed_at: the newest row is the claim's own.
		lookupSQL: `SELECT processed_at, expires_at FROM ` + t + ` WHERE key = $3::uuid AND consumer = $1 AND message_id = $2
ORDER BY processed_at DESC LIMIT 1`,
	}
	for v := range l.claimWith {
		cols, values, exp, n := cols, "", m.expires, 4
		if v&claimRetention != 0 {
			exp = fmt.Sprintf("now() + $%d::bigint * interval '1 microsecond'", n)
			n++
		}
		if v&claimFingerprint != 0 {
			cols = strings.TrimSuffix(cols, ")") + ", fingerprint)"
			values = fmt.Sprintf(", $%d::bytea", n)
		}
		// The sealed partitions are looked up (the Append prunes the others
		// at run time). The unsealed ones are inserted into, oldest first,
		// and the current one last, only when every older one took the key.
		// With two or more unsealed partitions before the current one (no
		// seal for two spans), the unsealed ones are looked up too (see
		// noStrayCopies).
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
	return l
}

// newCitusPartitionedLayout is the partitioned layout of a table Citus
// distributes: its claims call the function partitionFuncSQL makes (fn).
func newCitusPartitionedLayout(m messageStatements, meta, fn string) partitionedLayout {
	l := newPartitionedLayout(m, meta)
	l.placement, l.citus = citusPlacement(m.lockTimeoutMS), true
	call := func(ids, keys, exp, fp string) string {
		return `SELECT ` + fn + `('` + m.table + `'::pg_catalog.regclass, '` + meta + `'::pg_catalog.regclass, $1::text, ` +
			ids + `, ` + keys + `, ` + exp + `, ` + fp + `)`
	}
	for v := range l.claimWith {
		exp, fp, n := m.expires, "NULL", 4
		if v&claimRetention != 0 {
			exp = fmt.Sprintf("now() + $%d::bigint * interval '1 microsecond'", n)
			n++
		}
		if v&claimFingerprint != 0 {
			fp = fmt.Sprintf("$%d::bytea", n)
		}
		l.claimWith[v] = `SELECT count(*) FROM (` + call(`ARRAY[$2::text]`, `ARRAY[$3::uuid]`, exp, fp) + `) f`
	}
	l.claimBatch = call(`$2::text[]`, `$3::uuid[]`, m.expires, "NULL")
	return l
}

// claimOne is the hand-over claim, with a SELECT after it for a fingerprint
// or a stored result, as on the plain table (all copies of a claim carry the
// same values).
func (l partitionedLayout) claimOne(c *idClaim) []statement {
	if l.citus {
		sts := claimOneWith(c, l.claimWith)
		sts[0].affected = nil
		sts[0].row = func(scan func(dest ...any) error) error {
			var n int64
			err := scan(&n)
			c.claimed = n == 1
			return err
		}
		return sts
	}
	return claimOneWith(c, l.claimWith)
}

// storeResult updates every copy of the ID's row.
func (l partitionedLayout) storeResult(c *idClaim, result []byte) statement {
	return plainLayout{}.storeResult(c, result)
}

func (l partitionedLayout) lookup(r *lookupRow) statement {
	s := r.store
	return statement{sql: l.lookupSQL, args: []any{s.cfg.Consumer, r.id, Key(s.cfg.Consumer, r.id)}, row: r.scan}
}

// forget deletes every copy of the ID's row.
func (l partitionedLayout) forget(c *forgetClaim) []statement { return forgetStatements(l, c) }

func (l partitionedLayout) claimMany(c *batchClaim) []statement {
	s := c.store
	return []statement{{sql: l.claimBatch, args: []any{s.cfg.Consumer, c.sorted.ids, c.sorted.keys}, row: c.addFresh}}
}

// transient: a claim that finds no partition for its time (no cleaner ran
// for several spans, or Setup was not run) says what to do, and is one a
// later attempt cures (ActionFor).
func (l partitionedLayout) transient(err error) error {
	if code, _ := sqlState(err); code == "23514" && strings.Contains(err.Error(), "no partition") {
		return &curableError{fmt.Errorf("%w (partitions are created ahead by Cleanup: run RunCleaner or `pgdedup cleanup` at least every partition span; "+
			"see docs/partitioning.md)", err)}
	}
	return l.placement.transient(err)
}

// On Citus the claim is a function on the coordinator, one call per claim
// (one round trip from the client). Citus refuses the statement above in one
// piece: its router planner refuses clock_timestamp() in a CTE, and the plan
// it falls back to sends every CTE to every worker (a two-phase commit per
// claim) and counts an INSERT … SELECT's conflicting rows as inserted. The
// function runs the same steps as statements Citus routes to the ID's shard
// (every one names consumer, message_id and key): it takes a shared advisory
// lock on the coordinator (partitionClaimLockClass, the table's OID), which
// sealing waits for as for a lock on the table, reads sealed and the span,
// then the coordinator's clock; looks the key up in the sealed partitions;
// inserts it into each unsealed partition older than the current one,
// stopping at the first that had it; and then into the current one. A batch
// with no unsealed partition before the current one (all but just after a
// switch) is one look-up of its keys and one multi-row insert.
// Citus commits a transaction's shards before the coordinator lets go of its
// locks, so a claim's rows are committed when sealing sees its lock gone.

// partitionClaimLockClass is the first half of the advisory lock a claim on
// Citus holds ("pgde"); the second is the table's OID.
const partitionClaimLockClass = "1885824101"

// partitionFunc returns the quoted name of the Citus claim function beside
// table.
func partitionFunc(table pgx.Identifier) string {
	if len(table) == 2 {
		return pgx.Identifier{table[0], "pgdedup_partitioned_claim"}.Sanitize()
	}
	return pgx.Identifier{"pgdedup_partitioned_claim"}.Sanitize()
}

// partitionFuncSQL creates the claim function fn for table (quoted), in one
// transaction with the checks of partitionFuncCheckSQL: a function of that
// name that another role made is refused, pgdedup's own is kept if it is
// this release's and dropped and created again if not. The function
// returns, for each of ids (keys their keys) that was not claimed before,
// its ID.
func partitionFuncSQL(fn, table string) string {
	body := partitionFuncBody()
	create := `CREATE FUNCTION ` + fn + `(t pg_catalog.regclass, meta pg_catalog.regclass, c pg_catalog.text,
    ids pg_catalog.text[], keys pg_catalog.uuid[], exp pg_catalog.timestamptz, fp pg_catalog.bytea)
RETURNS SETOF pg_catalog.text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS ` + dollarQuote(body)
	return `DO $pgdedup$
DECLARE
    r    record;
    keep pg_catalog.bool := false;
BEGIN
` + partitionFuncCheckSQL(fn, `'`+table+`'::pg_catalog.regclass::pg_catalog.oid`, body) + `    IF NOT keep THEN
        EXECUTE ` + dollarQuote(create) + `;
    END IF;
END
$pgdedup$`
}

// partitionFuncBody is the body of the Citus claim function.
func partitionFuncBody() string {
	return `
DECLARE
    span   interval;
    sealed timestamptz;
    at     timestamptz;
    lo     timestamptz;
    g      timestamptz;
    n      bigint;
    i      int;
    ok     boolean;
    seen   uuid[];
    vals   text;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(` + partitionClaimLockClass + `, t::oid::int4);
    EXECUTE format('SELECT span, sealed FROM %s WHERE parent = $1', meta) INTO span, sealed USING t;
    at := clock_timestamp();
    IF span IS NULL THEN
        at := NULL; -- no partition for it: the insert fails and says so
    ELSE
        lo := date_bin(span, at, ` + partitionOrigin + `);
    END IF;
    -- A batch with no unsealed partition before the current one (all but
    -- just after a switch): one look-up, one multi-row insert, which Citus
    -- routes row by row, shard after shard.
    IF array_length(ids, 1) > 1 AND at IS NOT NULL AND sealed >= lo THEN
        EXECUTE format('SELECT coalesce(array_agg(key), ''{}'') FROM %s
            WHERE key = ANY ($1) AND consumer = $2 AND message_id = ANY ($3) AND processed_at < $4', t)
            INTO seen USING keys, c, ids, sealed;
        SELECT string_agg(format('(%L::uuid, %L, %L, %L::timestamptz, %L::timestamptz, %L::bytea)', u.k, c, u.id, at, exp, fp), ', ' ORDER BY u.n)
            INTO vals FROM unnest(keys, ids) WITH ORDINALITY AS u(k, id, n) WHERE u.k <> ALL (seen);
        IF vals IS NOT NULL THEN
            RETURN QUERY EXECUTE format('INSERT INTO %s (key, consumer, message_id, processed_at, expires_at, fingerprint)
                VALUES %s ON CONFLICT DO NOTHING RETURNING message_id', t, vals);
        END IF;
        RETURN;
    END IF;
    FOR i IN 1 .. coalesce(array_length(ids, 1), 0) LOOP
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE key = $1 AND consumer = $2 AND message_id = $3 AND processed_at < $4)', t)
            INTO ok USING keys[i], c, ids[i], sealed;
        ok := NOT ok;
        IF ok AND at IS NOT NULL THEN
            FOR g IN SELECT s FROM generate_series(sealed, lo - span, span) s LOOP
                EXECUTE format('INSERT INTO %s (key, consumer, message_id, processed_at, expires_at, fingerprint)
                    VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING', t) USING keys[i], c, ids[i], g, exp, fp;
                GET DIAGNOSTICS n = ROW_COUNT;
                ok := n = 1;
                EXIT WHEN NOT ok;
            END LOOP;
        END IF;
        IF ok THEN
            EXECUTE format('INSERT INTO %s (key, consumer, message_id, processed_at, expires_at, fingerprint)
                VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING', t) USING keys[i], c, ids[i], at, exp, fp;
            GET DIAGNOSTICS n = ROW_COUNT;
            IF n = 1 THEN
                RETURN NEXT ids[i];
            END IF;
        END IF;
    END LOOP;
END
`
}
