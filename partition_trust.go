package pgdedup

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgdedup never uses an object it did not create in the same transaction
// (issue 26). A role with CREATE on the table's schema can create any name
// first: a pgdedup_partitions with triggers, a sequence named like a
// partition's unique index, a table named like the next partition, a
// function named like the Citus claim function. So no statement of pgdedup
// says IF NOT EXISTS or OR REPLACE on a name in that schema. Each object is
// created by a plain CREATE, after a check in the same transaction that the
// name is free, and an object found under a wanted name is used only if it
// passes the checks below; otherwise the statement fails with an error that
// names the object and its owner (SQLSTATE PGD05).
//
// An owner is trusted if its code may run as the session without giving
// anyone more than they have: the dedup table's owner, the role running
// pgdedup, or a superuser.

// trustedSQL is an SQL condition: the role of OID o (an expression) is
// trusted for the table of OID t (an expression).
func trustedSQL(o, t string) string {
	return `(` + o + ` OPERATOR(pg_catalog.=) (SELECT relowner FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) ` + t + `)
        OR ` + o + ` OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) CURRENT_USER)
        OR coalesce((SELECT rolsuper FROM pg_catalog.pg_roles WHERE oid OPERATOR(pg_catalog.=) ` + o + `), false))`
}

// refusedSQL is a PL/pgSQL statement raising PGD05 with msg (a format()
// string whose arguments are args), followed by the rule.
func refusedSQL(msg, args string) string {
	return `RAISE EXCEPTION USING ERRCODE = 'PGD05', MESSAGE = pg_catalog.format('` + msg +
		`: pgdedup never uses an object it did not create; drop or rename it once you know who made it and why (docs/operations.md, threat model)', ` + args + `);`
}

// nameArray is names as an SQL name[] literal.
func nameArray(names ...string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = quoteLiteral(n)
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
        IF NOT ` + trustedSQL("r.o", t) + ` THEN
            ` + refusedSQL(`%I.%I exists, owned by role %I, under a name pgdedup creates`, `r.nspname, r.name, r.owner`) + `
        END IF;
    END LOOP;
`
}

// partitionMetaSQL is PL/pgSQL that makes pgdedup_partitions (meta, quoted)
// usable for the table of OID t (an expression): created if missing (in the
// caller's transaction), and otherwise checked: a plain table of a trusted
// owner, without triggers, rules or row security. It needs `r record`.
func partitionMetaSQL(meta, t string) string {
	return `    IF pg_catalog.to_regclass(` + quoteLiteral(meta) + `) IS NULL THEN
        CREATE TABLE ` + meta + ` (
            parent regclass    PRIMARY KEY,
            span   interval    NOT NULL,
            sealed timestamptz NOT NULL
        );
    ELSE
        SELECT c.oid, c.relkind, c.relrowsecurity, c.relowner, pg_catalog.pg_get_userbyid(c.relowner) AS owner INTO r
        FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(` + quoteLiteral(meta) + `)::pg_catalog.oid;
        IF NOT ` + trustedSQL("r.relowner", t) + ` THEN
            ` + refusedSQL(`%s exists, owned by role %I, which does not own the dedup table`, quoteLiteral(meta)+`, r.owner`) + `
        END IF;
        IF r.relkind OPERATOR(pg_catalog.<>) 'r' OR r.relrowsecurity
           OR EXISTS (SELECT FROM pg_catalog.pg_trigger WHERE tgrelid OPERATOR(pg_catalog.=) r.oid AND NOT tgisinternal)
           OR EXISTS (SELECT FROM pg_catalog.pg_rewrite WHERE ev_class OPERATOR(pg_catalog.=) r.oid)
           OR EXISTS (SELECT FROM pg_catalog.pg_policy WHERE polrelid OPERATOR(pg_catalog.=) r.oid) THEN
            ` + refusedSQL(`%s (owned by role %I) is not a plain table, or has triggers, rules or row security`, quoteLiteral(meta)+`, r.owner`) + `
        END IF;
    END IF;
`
}

// checkPartitionMeta checks, in a query of its own, what partitionMetaSQL
// checks of an existing pgdedup_partitions (Cleanup and Stats read and
// update it).
func (s *Store) checkPartitionMeta(ctx context.Context) error {
	t := `'` + s.messages.table + `'::pg_catalog.regclass::pg_catalog.oid`
	var problem string
	err := s.db.QueryRow(ctx, `SELECT coalesce((SELECT CASE
    WHEN NOT `+trustedSQL("c.relowner", t)+` THEN pg_catalog.format('%s is owned by role %I, which does not own the dedup table', $1::text, pg_catalog.pg_get_userbyid(c.relowner))
    WHEN c.relkind OPERATOR(pg_catalog.<>) 'r' OR c.relrowsecurity
      OR EXISTS (SELECT FROM pg_catalog.pg_trigger WHERE tgrelid OPERATOR(pg_catalog.=) c.oid AND NOT tgisinternal)
      OR EXISTS (SELECT FROM pg_catalog.pg_rewrite WHERE ev_class OPERATOR(pg_catalog.=) c.oid)
      OR EXISTS (SELECT FROM pg_catalog.pg_policy WHERE polrelid OPERATOR(pg_catalog.=) c.oid)
    THEN pg_catalog.format('%s (owned by role %I) is not a plain table, or has triggers, rules or row security', $1::text, pg_catalog.pg_get_userbyid(c.relowner))
    END FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1::text)::pg_catalog.oid), '')`,
		s.partitionMeta).Scan(&problem)
	if err != nil {
		return fmt.Errorf("pgdedup: check %s: %w", s.partitionMeta, withDetail(err))
	}
	if problem != "" {
		return fmt.Errorf("pgdedup: %s: refused: %s: pgdedup never uses an object it did not create (docs/operations.md, threat model)", s.messages.table, problem)
	}
	return nil
}

// checkPartitionSQL is PL/pgSQL that, if the table of OID t (an expression)
// has a partition named name, checks it and RETURNs: its owner must be
// trusted, and it must have a valid unique index on exactly the columns
// unique (plain names). It needs `r record`.
func checkPartitionSQL(t, name string, unique ...string) string {
	return `    SELECT c.oid, c.relowner, pg_catalog.pg_get_userbyid(c.relowner) AS owner INTO r
    FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhrelid
    WHERE i.inhparent OPERATOR(pg_catalog.=) ` + t + ` AND c.relname OPERATOR(pg_catalog.=) ` + quoteLiteral(name) + `;
    IF FOUND THEN
        IF NOT ` + trustedSQL("r.relowner", t) + ` THEN
            ` + refusedSQL(`partition %I is owned by role %I, which does not own the dedup table`, quoteLiteral(name)+`, r.owner`) + `
        END IF;
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_index x WHERE x.indrelid OPERATOR(pg_catalog.=) r.oid
                       AND x.indisunique AND x.indisvalid AND x.indpred IS NULL AND x.indexprs IS NULL
                       AND (SELECT pg_catalog.array_agg(a.attname ORDER BY k.n) FROM pg_catalog.unnest(x.indkey::pg_catalog.int2[]) WITH ORDINALITY AS k(attnum, n)
                            JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) r.oid AND a.attnum OPERATOR(pg_catalog.=) k.attnum)
                           OPERATOR(pg_catalog.=) ` + nameArray(unique...) + `) THEN
            ` + refusedSQL(`partition %I (owned by role %I) has no valid unique index on (%s)`, quoteLiteral(name)+`, r.owner, `+quoteLiteral(strings.Join(unique, ", "))) + `
        END IF;
        RETURN;
    END IF;
`
}

// partitionFuncCheckSQL is PL/pgSQL that refuses any function named like
// the Citus claim function (fn, quoted) in the schemas a call of fn looks
// in, if its owner is not trusted: an overload would be called instead of
// pgdedup's. It drops pgdedup's own if its body is not body (an older
// release's), and sets keep if it is.
func partitionFuncCheckSQL(fn, t, body string) string {
	schemas := `pg_catalog.current_schemas(false)`
	if id := strings.SplitN(fn, ".", 2); len(id) == 2 {
		schemas = `ARRAY[` + quoteLiteral(strings.ReplaceAll(strings.Trim(id[0], `"`), `""`, `"`)) + `]::pg_catalog.name[]`
	}
	return `    FOR r IN SELECT p.oid, p.proowner, p.prosrc, n.nspname, pg_catalog.pg_get_userbyid(p.proowner) AS owner,
             pg_catalog.pg_get_function_identity_arguments(p.oid) AS args
             FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
             WHERE p.proname OPERATOR(pg_catalog.=) 'pgdedup_partitioned_claim' AND n.nspname OPERATOR(pg_catalog.=) ANY (` + schemas + `) LOOP
        IF NOT ` + trustedSQL("r.proowner", t) + ` THEN
            ` + refusedSQL(`function %I.pgdedup_partitioned_claim(%s) exists, owned by role %I, which does not own the dedup table`, `r.nspname, r.args, r.owner`) + `
        ELSIF r.prosrc OPERATOR(pg_catalog.=) ` + dollarQuote(body) + ` THEN
            keep := true;
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

// lockHolders describes the sessions holding a lock on the table that
// partition creation waits for (SHARE UPDATE EXCLUSIVE or stronger), for
// ErrCleanupStarved.
func (s *Store) lockHolders(ctx context.Context) string {
	rows, _ := s.db.Query(ctx, `SELECT DISTINCT l.pid, l.mode, coalesce(a.usename::text, '?'), coalesce(a.application_name, ''), coalesce(a.state, '?'), a.xact_start
FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.granted AND l.relation = '`+s.messages.table+`'::pg_catalog.regclass::pg_catalog.oid
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
// owner is trusted: the insert trigger Setup creates calls it as every
// role that inserts. Migration 00003 made it. It needs `r record`.
func fillKeyCheckSQL(nsp, t string) string {
	return `    FOR r IN SELECT p.proowner, n.nspname, pg_catalog.pg_get_userbyid(p.proowner) AS owner
             FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
             WHERE p.pronamespace OPERATOR(pg_catalog.=) ` + nsp + ` AND p.proname OPERATOR(pg_catalog.=) 'pgdedup_fill_key' LOOP
        IF NOT ` + trustedSQL("r.proowner", t) + ` THEN
            ` + refusedSQL(`function %I.pgdedup_fill_key exists, owned by role %I, which does not own the dedup table`, `r.nspname, r.owner`) + `
        END IF;
    END LOOP;
`
}
