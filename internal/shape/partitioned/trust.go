package partitioned

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// pgdedup never uses an object it did not create in the same transaction
// (issue 26). A role with CREATE on the table's schema can create any name
// first. It could make a pgdedup_partitions with triggers, a sequence named
// like a partition's unique index, a table named like the next partition,
// or a function named like a placement's claim function. So no statement
// of pgdedup says IF NOT EXISTS or OR REPLACE on a name in that schema.
// Each object is created by a plain CREATE, after a check in the same
// transaction that the name is free. An object found under a wanted name is
// used only if it passes the checks below. Otherwise the statement fails
// with an error that names the object and its owner (SQLSTATE PGD05).
//
// An owner is trusted if its code may run as the session without giving
// anyone more than they have. The trusted owners are the dedup table's
// owner, the role running pgdedup, and superusers.

// TrustedSQL is an SQL condition that the role of OID o (an expression) is
// trusted for the table of OID t (an expression).
func TrustedSQL(o, t string) string {
	return `(` + o + ` OPERATOR(pg_catalog.=) (SELECT relowner FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) ` + t + `)
        OR ` + o + ` OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) CURRENT_USER)
        OR coalesce((SELECT rolsuper FROM pg_catalog.pg_roles WHERE oid OPERATOR(pg_catalog.=) ` + o + `), false))`
}

// RefusedSQL is a PL/pgSQL statement raising PGD05 with msg (a format()
// string whose arguments are args), followed by the rule.
func RefusedSQL(msg, args string) string {
	return `RAISE EXCEPTION USING ERRCODE = 'PGD05', MESSAGE = pg_catalog.format('` + msg +
		`: pgdedup never uses an object it did not create; drop or rename it once you know who made it and why (docs/operations.md, threat model)', ` + args + `);`
}

// nameArray is names as an SQL name[] literal.
func nameArray(names ...string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = shape.QuoteLiteral(n)
	}
	return `ARRAY[` + strings.Join(q, ", ") + `]::pg_catalog.name[]`
}

// refuseTakenSQL is PL/pgSQL that raises PGD05 if a relation or a type
// named one of names exists in the schema of OID nsp (an expression) and
// its owner is not trusted for the table of OID t, naming it and its owner.
// An object of a trusted owner (another cleaner's partition, committed since
// the caller looked) is left to the CREATE that follows, which then fails
// with a duplicate name, and is never used either. It needs `r record`.
func refuseTakenSQL(nsp, t string, names ...string) string {
	return `    FOR r IN SELECT n.nspname, c.relname AS name, c.relowner AS o, pg_catalog.pg_get_userbyid(c.relowner) AS owner
             FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
             WHERE c.relnamespace OPERATOR(pg_catalog.=) ` + nsp + ` AND c.relname OPERATOR(pg_catalog.=) ANY (` + nameArray(names...) + `)
             UNION ALL
             SELECT n.nspname, y.typname, y.typowner, pg_catalog.pg_get_userbyid(y.typowner)
             FROM pg_catalog.pg_type y JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) y.typnamespace
             WHERE y.typnamespace OPERATOR(pg_catalog.=) ` + nsp + ` AND y.typrelid OPERATOR(pg_catalog.=) 0
             AND y.typname OPERATOR(pg_catalog.=) ANY (` + nameArray(names...) + `) LOOP
        IF NOT ` + TrustedSQL("r.o", t) + ` THEN
            ` + RefusedSQL(`%I.%I exists, owned by role %I, under a name pgdedup creates`, `r.nspname, r.name, r.owner`) + `
        END IF;
    END LOOP;
`
}

// partitionMetaSQL is PL/pgSQL that makes pgdedup_partitions (meta, quoted)
// usable for the table of OID t (an expression). It is created if missing,
// in the caller's transaction. Otherwise it must be a plain table of a
// trusted owner, without triggers, rules or row security. It needs the
// variable r of type record.
func partitionMetaSQL(meta, t string) string {
	return `    IF pg_catalog.to_regclass(` + shape.QuoteLiteral(meta) + `) IS NULL THEN
        CREATE TABLE ` + meta + ` (
            parent regclass    PRIMARY KEY,
            span   interval    NOT NULL,
            sealed timestamptz NOT NULL
        );
    ELSE
        SELECT c.oid, c.relkind, c.relrowsecurity, c.relowner, pg_catalog.pg_get_userbyid(c.relowner) AS owner INTO r
        FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(` + shape.QuoteLiteral(meta) + `)::pg_catalog.oid;
        IF NOT ` + TrustedSQL("r.relowner", t) + ` THEN
            ` + RefusedSQL(`%s exists, owned by role %I, which does not own the dedup table`, shape.QuoteLiteral(meta)+`, r.owner`) + `
        END IF;
        IF r.relkind OPERATOR(pg_catalog.<>) 'r' OR r.relrowsecurity
           OR EXISTS (SELECT FROM pg_catalog.pg_trigger WHERE tgrelid OPERATOR(pg_catalog.=) r.oid AND NOT tgisinternal)
           OR EXISTS (SELECT FROM pg_catalog.pg_rewrite WHERE ev_class OPERATOR(pg_catalog.=) r.oid)
           OR EXISTS (SELECT FROM pg_catalog.pg_policy WHERE polrelid OPERATOR(pg_catalog.=) r.oid) THEN
            ` + RefusedSQL(`%s (owned by role %I) is not a plain table, or has triggers, rules or row security`, shape.QuoteLiteral(meta)+`, r.owner`) + `
        END IF;
    END IF;
`
}

// checkPartitionMeta checks, in a query of its own, what partitionMetaSQL
// checks of an existing pgdedup_partitions (Cleanup and Stats read and
// update it).
func (l *Shape) checkPartitionMeta(ctx context.Context) error {
	t := `'` + l.table + `'::pg_catalog.regclass::pg_catalog.oid`
	var problem string
	err := l.db.QueryRow(ctx, `SELECT coalesce((SELECT CASE
    WHEN NOT `+TrustedSQL("c.relowner", t)+` THEN pg_catalog.format('%s is owned by role %I, which does not own the dedup table', $1::text, pg_catalog.pg_get_userbyid(c.relowner))
    WHEN c.relkind OPERATOR(pg_catalog.<>) 'r' OR c.relrowsecurity
      OR EXISTS (SELECT FROM pg_catalog.pg_trigger WHERE tgrelid OPERATOR(pg_catalog.=) c.oid AND NOT tgisinternal)
      OR EXISTS (SELECT FROM pg_catalog.pg_rewrite WHERE ev_class OPERATOR(pg_catalog.=) c.oid)
      OR EXISTS (SELECT FROM pg_catalog.pg_policy WHERE polrelid OPERATOR(pg_catalog.=) c.oid)
    THEN pg_catalog.format('%s (owned by role %I) is not a plain table, or has triggers, rules or row security', $1::text, pg_catalog.pg_get_userbyid(c.relowner))
    END FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1::text)::pg_catalog.oid), '')`,
		l.meta).Scan(&problem)
	if err != nil {
		return fmt.Errorf("pgdedup: check %s: %w", l.meta, shape.WithDetail(err))
	}
	if problem != "" {
		return fmt.Errorf("pgdedup: %s: refused: %s: pgdedup never uses an object it did not create (docs/operations.md, threat model)", l.table, problem)
	}
	return nil
}

// checkPartitionSQL is PL/pgSQL that checks the partition named name of the
// table of OID t (an expression), if there is one, and then RETURNs. Its
// owner must be trusted. It must have a valid unique index on exactly the
// columns unique (plain names). It needs the variable r of type record.
func checkPartitionSQL(t, name string, unique ...string) string {
	return `    SELECT c.oid, c.relowner, pg_catalog.pg_get_userbyid(c.relowner) AS owner INTO r
    FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhrelid
    WHERE i.inhparent OPERATOR(pg_catalog.=) ` + t + ` AND c.relname OPERATOR(pg_catalog.=) ` + shape.QuoteLiteral(name) + `;
    IF FOUND THEN
        IF NOT ` + TrustedSQL("r.relowner", t) + ` THEN
            ` + RefusedSQL(`partition %I is owned by role %I, which does not own the dedup table`, shape.QuoteLiteral(name)+`, r.owner`) + `
        END IF;
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_index x WHERE x.indrelid OPERATOR(pg_catalog.=) r.oid
                       AND x.indisunique AND x.indisvalid AND x.indpred IS NULL AND x.indexprs IS NULL
                       AND (SELECT pg_catalog.array_agg(a.attname ORDER BY k.n) FROM pg_catalog.unnest(x.indkey::pg_catalog.int2[]) WITH ORDINALITY AS k(attnum, n)
                            JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) r.oid AND a.attnum OPERATOR(pg_catalog.=) k.attnum)
                           OPERATOR(pg_catalog.=) ` + nameArray(unique...) + `) THEN
            ` + RefusedSQL(`partition %I (owned by role %I) has no valid unique index on (%s)`, shape.QuoteLiteral(name)+`, r.owner, `+shape.QuoteLiteral(strings.Join(unique, ", "))) + `
        END IF;
        RETURN;
    END IF;
`
}

// lockHolders describes the sessions holding a lock on the table that
// partition creation waits for (SHARE UPDATE EXCLUSIVE or stronger), for
// shape.ErrCleanupStarved.
func (l *Shape) lockHolders(ctx context.Context) string {
	rows, _ := l.db.Query(ctx, `SELECT DISTINCT l.pid, l.mode, coalesce(a.usename::text, '?'), coalesce(a.application_name, ''), coalesce(a.state, '?'), a.xact_start
FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.granted AND l.relation = '`+l.table+`'::pg_catalog.regclass::pg_catalog.oid
AND l.mode IN ('ShareUpdateExclusiveLock', 'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
AND l.pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
ORDER BY 1`)
	var described []string
	var pid *int32
	var mode, role, app, state string
	var since *time.Time
	_, err := pgx.ForEachRow(rows, []any{&pid, &mode, &role, &app, &state, &since}, func() error {
		described = append(described, describeSession(pid, role, app, state, since)+" with "+mode)
		return nil
	})
	if err != nil || len(described) == 0 {
		return "a session holding a lock on the table (none found on this node: on Citus it may be on a worker)"
	}
	return strings.Join(described, ", ")
}

// fillKeyCheckSQL is PL/pgSQL that refuses the functions named
// pgdedup_fill_key in the schema of OID nsp (an expression) unless their
// owner is trusted. The insert trigger Setup creates calls it as every role
// that inserts. Migration 00003 made it. It needs the variable r of type
// record.
func fillKeyCheckSQL(nsp, t string) string {
	return `    FOR r IN SELECT p.proowner, n.nspname, pg_catalog.pg_get_userbyid(p.proowner) AS owner
             FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
             WHERE p.pronamespace OPERATOR(pg_catalog.=) ` + nsp + ` AND p.proname OPERATOR(pg_catalog.=) 'pgdedup_fill_key' LOOP
        IF NOT ` + TrustedSQL("r.proowner", t) + ` THEN
            ` + RefusedSQL(`function %I.pgdedup_fill_key exists, owned by role %I, which does not own the dedup table`, `r.nspname, r.owner`) + `
        END IF;
    END LOOP;
`
}
