package partitioned

// A table swap (setupSQL, and the online move in move.go) carries more
// from the plain table to the partitioned one than its columns, defaults,
// table grants and 00003's key trigger. It carries row-level security (its
// switch, FORCE and every policy) and column grants. A trigger of the
// user's own is refused with an error naming it, rather than dropped
// silently. A row trigger on a partitioned table fires on every partition.
// Whether that is what its author meant is not for Setup to decide.

// keepObjectsSQL returns two pieces of PL/pgSQL for a swap. collect, run
// while the plain table (the OID expression src) still stands, refuses its
// own triggers and builds the statements that carry its row-level security
// and column grants over to target (quoted), and grant SELECT on meta to
// whoever a column grant lets insert. apply runs them once target is the
// partitioned table. They need the variables `g record`, `kept
// pg_catalog.text[]` (empty) and `stmt pg_catalog.text`.
func keepObjectsSQL(src, target, meta string) (collect, apply string) {
	grantee := `CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)::pg_catalog.text) END`
	collect = `
    SELECT pg_catalog.string_agg(pg_catalog.quote_ident(tg.tgname::pg_catalog.text), ', ' ORDER BY tg.tgname) INTO stmt
    FROM pg_catalog.pg_trigger tg JOIN pg_catalog.pg_proc f ON f.oid OPERATOR(pg_catalog.=) tg.tgfoid
    WHERE tg.tgrelid OPERATOR(pg_catalog.=) ` + src + ` AND NOT tg.tgisinternal
    AND tg.tgname OPERATOR(pg_catalog.<>) 'processed_messages_fill_key'
    AND f.pronamespace OPERATOR(pg_catalog.<>) 'pg_catalog'::pg_catalog.regnamespace::pg_catalog.oid;
    IF stmt IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PGD05', MESSAGE = pg_catalog.format('table %s has trigger(s) %s, which the partitioned table would not have: '
            'drop them, run Setup, and create them on the partitioned table', ` + src + `::pg_catalog.regclass, stmt);
    END IF;
    IF (SELECT relrowsecurity FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) ` + src + `) THEN
        kept := kept OPERATOR(pg_catalog.||) 'ALTER TABLE ` + target + ` ENABLE ROW LEVEL SECURITY'::pg_catalog.text;
    END IF;
    IF (SELECT relforcerowsecurity FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) ` + src + `) THEN
        kept := kept OPERATOR(pg_catalog.||) 'ALTER TABLE ` + target + ` FORCE ROW LEVEL SECURITY'::pg_catalog.text;
    END IF;
    FOR g IN SELECT p.polname, p.polpermissive, p.polcmd,
             (SELECT pg_catalog.string_agg(CASE WHEN rr.oid OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                     ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(rr.oid)::pg_catalog.text) END, ', ')
              FROM pg_catalog.unnest(p.polroles) rr(oid)) AS roles,
             pg_catalog.pg_get_expr(p.polqual, p.polrelid) AS qual, pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid) AS chk
             FROM pg_catalog.pg_policy p WHERE p.polrelid OPERATOR(pg_catalog.=) ` + src + ` ORDER BY p.polname LOOP
        kept := kept OPERATOR(pg_catalog.||) pg_catalog.format('CREATE POLICY %I ON ` + target + ` AS %s FOR %s TO %s%s%s', g.polname,
            CASE WHEN g.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END,
            CASE g.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE' WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
            g.roles,
            CASE WHEN g.qual IS NOT NULL THEN pg_catalog.format(' USING (%s)', g.qual) ELSE '' END,
            CASE WHEN g.chk IS NOT NULL THEN pg_catalog.format(' WITH CHECK (%s)', g.chk) ELSE '' END);
    END LOOP;
    FOR g IN SELECT a.attname, x.privilege_type, x.grantee, x.is_grantable
             FROM pg_catalog.pg_attribute a CROSS JOIN LATERAL pg_catalog.aclexplode(a.attacl) x
             WHERE a.attrelid OPERATOR(pg_catalog.=) ` + src + ` AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
             AND x.grantee OPERATOR(pg_catalog.<>) x.grantor ORDER BY a.attnum LOOP
        kept := kept OPERATOR(pg_catalog.||) pg_catalog.format('GRANT %s (%I) ON ` + target + ` TO %s%s', g.privilege_type, g.attname, ` + grantee + `,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        IF g.privilege_type OPERATOR(pg_catalog.=) 'INSERT' THEN
            kept := kept OPERATOR(pg_catalog.||) pg_catalog.format('GRANT SELECT ON ` + meta + ` TO %s', ` + grantee + `);
        END IF;
    END LOOP;
`
	apply = `
    FOREACH stmt IN ARRAY kept LOOP
        EXECUTE stmt;
    END LOOP;
`
	return collect, apply
}
