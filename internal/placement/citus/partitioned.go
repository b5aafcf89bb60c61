package citus

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/shape"
	"github.com/pgdedup/pgdedup/internal/shape/partitioned"
	"github.com/pgdedup/pgdedup/internal/shape/plain"
)

// On Citus the partitioned claim is a function on the coordinator, one call
// per claim, one round trip from the client. Citus refuses the partitioned
// shape's statement in one piece. Its router planner refuses
// clock_timestamp() in a CTE. The plan it falls back to sends every CTE to
// every worker, a two-phase commit per claim, and counts an INSERT …
// SELECT's conflicting rows as inserted. The function runs the same steps
// as statements Citus routes to the ID's shard, each naming consumer,
// message_id and key. It locks the table in ROW EXCLUSIVE mode on the
// coordinator only (Citus's lock_relation_if_exists, which checks the
// caller's privileges, as LOCK TABLE does). Sealing waits for that lock as
// for any claim's lock on the table. A shared advisory lock served before,
// but any role that can connect could take it exclusively and stop every
// claim. It reads sealed and the span, then the
// coordinator's clock. It looks the key up in the sealed partitions. It
// inserts the key into each unsealed partition older than the current one,
// stopping at the first that had it, and then into the current one. A batch
// with no unsealed partition before the current one is one look-up of its
// keys and one multi-row insert. That is every batch but those just after
// a switch. Citus commits a transaction's shards before the coordinator
// lets go of its locks. So a claim's rows are committed when sealing sees
// its lock gone.
//
// With a time (shape.One.Since, its last argument), the function looks
// and hands over only from the start of that time's partition, as the
// bounded claims of one server do (docs/partitioning.md). When that is the
// coordinator's current partition, it neither looks up nor hands over: the
// claim is one routed INSERT.
//
// A claim with a time calls no function, but around a switch. When the
// time's partition is the client's current one, the claim is that routed
// INSERT, sent by the client: the coordinator evaluates clock_timestamp()
// and Citus routes the row to the ID's shard, as on the plain table. It
// returns the row's processed_at. When the time's partition is an older
// one, the INSERT follows a read of sealed and a look-up of the ID routed
// to its shard, in one round trip. A row outside the client's partition (a
// clock near a switch, or skewed), sealed short of it, or the ID found
// older, is deleted, and the function claims (partitioned's claimRouted). The INSERT takes ROW EXCLUSIVE on the table on the
// coordinator, which sealing waits for, as the function's lock.
//
// The function of the release before took no
// time. It stays, as a wrapper that passes none, so that a Store of that
// release keeps claiming during a rolling upgrade. A Store calls the
// function with a time only where Setup made it (SinceQuery).

// Partitioned is what the partitioned shape asks of a table Citus
// distributes (partitioned.Placement).
type Partitioned struct {
	Placement
	fn    string // the quoted claim function
	since bool   // the function takes a time (SinceQuery)
}

// NewPartitioned returns the Citus placement of a partitioned table whose
// claim function is fn (ClaimFunc). With since, claims pass their time.
func NewPartitioned(lockTimeoutMS int64, fn string, since bool) Partitioned {
	return Partitioned{Placement: Placement(lockTimeoutMS), fn: fn, since: since}
}

// sinceArgs are the argument types of the claim function that takes a
// time. The one before took all but the last.
const sinceArgs = `(pg_catalog.regclass, pg_catalog.regclass, pg_catalog.text, pg_catalog.text[], pg_catalog.uuid[], pg_catalog.timestamptz, pg_catalog.bytea, pg_catalog.timestamptz)`

// SinceQuery reports ($1 the quoted table) whether the claim function fn
// that takes a time exists, owned by a role pgdedup trusts. Setup makes
// it. A Store of this release before that Setup claims without a time.
func SinceQuery(fn string) string {
	return `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p WHERE p.oid = pg_catalog.to_regprocedure(` +
		shape.QuoteLiteral(fn+sinceArgs) + `) AND ` + partitioned.TrustedSQL("p.proowner", "pg_catalog.to_regclass($1)") + `)`
}

// ClaimFunc returns the quoted name of the claim function beside table.
func ClaimFunc(table pgx.Identifier) string {
	if len(table) == 2 {
		return pgx.Identifier{table[0], "pgdedup_partitioned_claim"}.Sanitize()
	}
	return pgx.Identifier{"pgdedup_partitioned_claim"}.Sanitize()
}

// Claims call the claim function.
func (p Partitioned) Claims(m plain.Statements, meta string) *partitioned.Claims {
	call := func(ids, keys, exp, fp string, n int) string {
		since := ""
		if p.since {
			since = fmt.Sprintf(", $%d::pg_catalog.timestamptz", n)
		}
		return `SELECT ` + p.fn + `('` + m.Table + `'::pg_catalog.regclass, '` + meta + `'::pg_catalog.regclass, $1::text, ` +
			ids + `, ` + keys + `, ` + exp + `, ` + fp + since + `)`
	}
	c := partitioned.Claims{Since: p.since, Fresh: new([4]string),
		Undo: `DELETE FROM ` + m.Table + ` WHERE key = $3::uuid AND consumer = $1 AND message_id = $2 AND processed_at = $4::pg_catalog.timestamptz`}
	for v := range c.One {
		exp, fp, n := m.Expires, "NULL", 4
		if v&plain.ClaimRetention != 0 {
			exp = fmt.Sprintf("now() + $%d::bigint * interval '1 microsecond'", n)
			n++
		}
		if v&plain.ClaimFingerprint != 0 {
			fp = fmt.Sprintf("$%d::bytea", n)
			n++
		}
		c.One[v] = `SELECT count(*) FROM (` + call(`ARRAY[$2::text]`, `ARRAY[$3::uuid]`, exp, fp, n) + `) f`
		// The fresh claim: one INSERT that Citus routes to the ID's shard,
		// the coordinator evaluating the clock.
		c.Fresh[v] = `INSERT INTO ` + m.Table + ` (key, consumer, message_id, processed_at, expires_at, fingerprint)
VALUES ($3::uuid, $1::text, $2::text, pg_catalog.clock_timestamp(), ` + exp + `, ` + fp + `)
ON CONFLICT DO NOTHING RETURNING processed_at`
	}
	c.Batch = call(`$2::text[]`, `$3::uuid[]`, m.Expires, "NULL", 4)
	return &c
}

// Distribution reads the column Citus distributes table by.
func (Partitioned) Distribution(ctx context.Context, db shape.DB, table string) (string, error) {
	var installed bool
	var column string
	err := db.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`).Scan(&installed)
	if err == nil && installed {
		err = db.QueryRow(ctx, `SELECT coalesce((SELECT pg_catalog.column_to_column_name(logicalrelid, partkey)
FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1::pg_catalog.regclass), '')`, table).Scan(&column)
	}
	return column, err
}

// Distributed reports whether Citus distributes table.
func (Partitioned) Distributed(ctx context.Context, db shape.DB, table string) (bool, error) {
	var installed, distributed bool
	err := db.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`).Scan(&installed)
	if err == nil && installed {
		err = db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1))`,
			table).Scan(&distributed)
	}
	return distributed, err
}

// AttachLock takes the lock on the coordinator only, where cleaners run.
// Citus's LOCK TABLE locks every shard of every partition on every node, a
// third of a second per partition created. It checks the same privileges.
func (Partitioned) AttachLock(parent string) string {
	return `PERFORM pg_catalog.lock_relation_if_exists(` + shape.QuoteLiteral(parent) + `, 'SHARE UPDATE EXCLUSIVE')`
}

// detachLockTimeout bounds how long a DETACH waits for each lock it takes.
// Claims queue behind it meanwhile.
const detachLockTimeout = 500 * time.Millisecond

// Detach detaches partition from table with a plain DETACH, since Citus
// refuses DETACH … CONCURRENTLY. It takes ACCESS EXCLUSIVE on the parent,
// on the coordinator and then on the workers' shards. Every lock it waits
// for is bounded by detachLockTimeout, with SET LOCAL, which Citus passes on
// to the workers. So a claim waits at most that long per node behind it,
// plus the detach itself, which changes only catalogs. Given up, the next
// run tries again.
func (Partitioned) Detach(ctx context.Context, db shape.DB, table, partition string) error {
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`SELECT pg_catalog.set_config('citus.propagate_set_commands', 'local', true)`)
	b.Queue(fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, detachLockTimeout.Milliseconds()))
	b.Queue(`ALTER TABLE ` + table + ` DETACH PARTITION ` + partition)
	b.Queue(`COMMIT`)
	return db.SendBatch(ctx, b).Close()
}

// SizesSQL reads the shards' sizes. Dead tuples are the workers'.
func (Partitioned) SizesSQL() string {
	return `SELECT citus_table_size(r), citus_total_relation_size(r) - citus_table_size(r), 0::bigint
FROM pg_catalog.to_regclass($1::text) r`
}

// SetupSQL keeps the distribution column, shards and co-location group of
// the table. The business tables stay co-located with it.
func (Partitioned) SetupSQL(t string) (prepare, distribute string) {
	prepare = `        -- On Citus, the same distribution column, shards and co-location
        -- group (the business tables co-located with it).
        IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
            EXECUTE $q$SELECT pg_catalog.column_to_column_name(p.logicalrelid, p.partkey), p.partmethod
                FROM pg_catalog.pg_dist_partition p WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1$q$ INTO col, pm USING t;
            IF pm IS NOT NULL AND pm OPERATOR(pg_catalog.<>) 'h' THEN
                RAISE EXCEPTION 'table ` + t + ` is a Citus table not distributed by hash: the Partitioned layout needs it distributed by a column (see docs/citus.md)';
            END IF;
            PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);
            PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
        END IF;
`
	distribute = `        IF col IS NOT NULL THEN -- while the old table is there to co-locate with
            EXECUTE pg_catalog.format('SELECT pg_catalog.create_distributed_table(%L, %L, colocate_with => %L)',
                pg_catalog.format('%I.pgdedup_partitioned_new', nsp), col, pg_catalog.format('%I.%I', nsp, rel));
        END IF;
`
	return prepare, distribute
}

// RefusePopulated refuses to move a populated distributed table.
func (Partitioned) RefusePopulated(table string) error {
	return fmt.Errorf("pgdedup: setup %s: the table is distributed by Citus and holds IDs: moving a populated table runs on plain PostgreSQL only "+
		"(on Citus Setup replaces an empty table)", table)
}

// CreateClaims creates the claim function (see funcSQL).
func (p Partitioned) CreateClaims(ctx context.Context, db shape.DB, table string) error {
	return shape.Exec(ctx, db, funcSQL(p.fn, table))
}

// funcSQL creates the claim functions fn for table (quoted), in one
// transaction with the checks of funcCheckSQL: the one that takes a time,
// and the one without, which calls it. A function of that name that
// another role made is refused. pgdedup's own is kept if it is this
// release's, and dropped and created again if not. The functions return
// the IDs among ids that were not claimed before (keys are their keys).
func funcSQL(fn, table string) string {
	body := funcBody()
	args := `t pg_catalog.regclass, meta pg_catalog.regclass, c pg_catalog.text,
    ids pg_catalog.text[], keys pg_catalog.uuid[], exp pg_catalog.timestamptz, fp pg_catalog.bytea`
	create := `CREATE FUNCTION ` + fn + `(` + args + `, since pg_catalog.timestamptz)
RETURNS SETOF pg_catalog.text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS ` + dollarQuote(body)
	createWrap := `CREATE FUNCTION ` + fn + `(` + args + `)
RETURNS SETOF pg_catalog.text
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS `
	return `DO $pgdedup$
DECLARE
    r        record;
    keep     pg_catalog.bool := false;
    keepWrap pg_catalog.bool := false;
    nsp      pg_catalog.text := ` + funcSchema(fn) + `;
BEGIN
` + funcCheckSQL(fn, `'`+table+`'::pg_catalog.regclass::pg_catalog.oid`, body) + `    IF NOT keep THEN
        EXECUTE ` + dollarQuote(create) + `;
    END IF;
    IF NOT keepWrap THEN
        EXECUTE ` + dollarQuote(createWrap) + ` OPERATOR(pg_catalog.||) pg_catalog.quote_literal(` + wrapBody("nsp") + `);
    END IF;
END
$pgdedup$`
}

// wrapBody is SQL for the body of the claim function without a time in
// the schema nsp (an expression): it calls the one with a time, passing
// none.
func wrapBody(nsp string) string {
	return `pg_catalog.format('SELECT * FROM %I.pgdedup_partitioned_claim(t, meta, c, ids, keys, exp, fp, NULL::pg_catalog.timestamptz)', ` + nsp + `)`
}

// funcSchema is SQL for the schema the claim function fn is made in: its
// own, or the current schema.
func funcSchema(fn string) string {
	if id := strings.SplitN(fn, ".", 2); len(id) == 2 {
		return shape.QuoteLiteral(strings.ReplaceAll(strings.Trim(id[0], `"`), `""`, `"`))
	}
	return `pg_catalog.current_schema()`
}

// funcBody is the body of the Citus claim function.
func funcBody() string {
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
    seen   uuid[] := '{}';
    vals   text;
    lower  timestamptz; -- where a claim of the IDs can start, or NULL: anywhere
BEGIN
    PERFORM lock_relation_if_exists(t::text, 'ROW EXCLUSIVE');
    EXECUTE format('SELECT span, sealed FROM %s WHERE parent = $1', meta) INTO span, sealed USING t;
    at := clock_timestamp();
    IF span IS NULL THEN
        at := NULL; -- no partition for it: the insert fails and says so
    ELSE
        lo := date_bin(span, at, ` + partitioned.Origin + `);
        IF since IS NOT NULL THEN
            lower := LEAST(date_bin(span, since, ` + partitioned.Origin + `), lo);
        END IF;
    END IF;
    -- A batch with no unsealed partition before the current one within
    -- its bounds (all but just after a switch): at most one look-up, and
    -- one multi-row insert, which Citus routes row by row, shard after
    -- shard.
    IF array_length(ids, 1) > 1 AND at IS NOT NULL AND (sealed >= lo OR lower >= lo) THEN
        IF lower IS NULL OR lower < sealed THEN
            EXECUTE format('SELECT coalesce(array_agg(key), ''{}'') FROM %s
                WHERE key = ANY ($1) AND consumer = $2 AND message_id = ANY ($3) AND processed_at < $4 AND processed_at >= $5', t)
                INTO seen USING keys, c, ids, sealed, coalesce(lower, '-infinity');
        END IF;
        SELECT string_agg(format('(%L::uuid, %L, %L, %L::timestamptz, %L::timestamptz, %L::bytea)', u.k, c, u.id, at, exp, fp), ', ' ORDER BY u.n)
            INTO vals FROM unnest(keys, ids) WITH ORDINALITY AS u(k, id, n) WHERE u.k <> ALL (seen);
        IF vals IS NOT NULL THEN
            RETURN QUERY EXECUTE format('INSERT INTO %s (key, consumer, message_id, processed_at, expires_at, fingerprint)
                VALUES %s ON CONFLICT DO NOTHING RETURNING message_id', t, vals);
        END IF;
        RETURN;
    END IF;
    FOR i IN 1 .. coalesce(array_length(ids, 1), 0) LOOP
        -- A fresh claim (lower is the current partition) looks nowhere.
        ok := true;
        IF lower IS NULL OR lower < sealed THEN
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE key = $1 AND consumer = $2 AND message_id = $3
                AND processed_at < $4 AND processed_at >= $5)', t)
                INTO ok USING keys[i], c, ids[i], sealed, coalesce(lower, '-infinity');
            ok := NOT ok;
        END IF;
        IF ok AND at IS NOT NULL THEN
            FOR g IN SELECT s FROM generate_series(GREATEST(sealed, lower), lo - span, span) s LOOP
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

// funcCheckSQL is PL/pgSQL that refuses any function named like the claim
// functions (fn, quoted) in the schemas a call of fn looks in, if its owner
// is not trusted. Such an overload would be called instead of pgdedup's.
// It drops pgdedup's own if its body is not this release's (body for the
// one with a time, wrapBody for the one without). If it is, and the
// function is in nsp, it sets keep or keepWrap.
func funcCheckSQL(fn, t, body string) string {
	schemas := `pg_catalog.current_schemas(false)`
	if id := strings.SplitN(fn, ".", 2); len(id) == 2 {
		schemas = `ARRAY[` + shape.QuoteLiteral(strings.ReplaceAll(strings.Trim(id[0], `"`), `""`, `"`)) + `]::pg_catalog.name[]`
	}
	return `    FOR r IN SELECT p.oid, p.proowner, p.prosrc, p.pronargs, n.nspname, pg_catalog.pg_get_userbyid(p.proowner) AS owner,
             pg_catalog.pg_get_function_identity_arguments(p.oid) AS args
             FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
             WHERE p.proname OPERATOR(pg_catalog.=) 'pgdedup_partitioned_claim' AND n.nspname OPERATOR(pg_catalog.=) ANY (` + schemas + `) LOOP
        IF NOT ` + partitioned.TrustedSQL("r.proowner", t) + ` THEN
            ` + partitioned.RefusedSQL(`function %I.pgdedup_partitioned_claim(%s) exists, owned by role %I, which does not own the dedup table`, `r.nspname, r.args, r.owner`) + `
        ELSIF r.pronargs OPERATOR(pg_catalog.=) 8 AND r.prosrc OPERATOR(pg_catalog.=) ` + dollarQuote(body) + ` THEN
            keep := keep OR r.nspname OPERATOR(pg_catalog.=) nsp;
        ELSIF r.pronargs OPERATOR(pg_catalog.=) 7 AND r.prosrc OPERATOR(pg_catalog.=) ` + wrapBody("r.nspname") + ` THEN
            keepWrap := keepWrap OR r.nspname OPERATOR(pg_catalog.=) nsp;
        ELSE
            EXECUTE pg_catalog.format('DROP FUNCTION %s', r.oid::pg_catalog.regprocedure);
        END IF;
    END LOOP;
`
}

// dollarQuote quotes s with a dollar tag that s does not contain.
func dollarQuote(s string) string {
	tag := "$pgdedup_body$"
	for i := 0; strings.Contains(s, tag); i++ {
		tag = fmt.Sprintf("$pgdedup_body%d$", i)
	}
	return tag + s + tag
}
