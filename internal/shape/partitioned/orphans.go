package partitioned

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// A partition is dropped in two steps, DETACH … CONCURRENTLY (or FINALIZE)
// and then DROP TABLE. A cleaner stopped between them leaves a table that
// is no longer a partition, and no later run would see it. The cleaner may
// have been killed, or its context cancelled, or its connection cut. So before detaching, Cleanup marks
// the partition with a comment naming its parent and its bounds, and each
// run drops the tables of the parent's schema that are no partition and
// carry the exact mark pgdedup writes under the exact name it gives that
// partition. A table a user made, or detached by hand, has no such mark
// and is never dropped.
//
// No claim reads such a table. The detach completed, and both DETACH …
// CONCURRENTLY and FINALIZE return only after every transaction that could
// still see the partition as part of the table has ended. A session that
// reads it directly holds DROP TABLE off for lock_timeout (2 s), and the
// table is left to the next run.

// detachMark is the comment Cleanup puts on a partition before detaching
// it.
func detachMark(parent string, from, to time.Time) string {
	return "pgdedup: detached from " + parent + " to be dropped; it held " +
		from.UTC().Format(time.RFC3339Nano) + " to " + to.UTC().Format(time.RFC3339Nano)
}

// markDetach puts detachMark on partition p before it is detached. COMMENT
// takes SHARE UPDATE EXCLUSIVE on p only, and claims go on.
func (l *Shape) markDetach(ctx context.Context, st *partitionState, p partitionInfo) error {
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`SELECT pg_catalog.set_config('lock_timeout', '2s', true)`)
	b.Queue(`COMMENT ON TABLE ` + st.quoted(p.name) + ` IS ` + shape.QuoteLiteral(detachMark(st.name, p.from, p.to)))
	b.Queue(`COMMIT`)
	return l.db.SendBatch(ctx, b).Close()
}

// dropOrphans drops the tables left detached by an interrupted Cleanup (see
// above) and returns them, with their rows (PostgreSQL's estimates). A
// table it cannot lock within lock_timeout is left to the next run.
func (l *Shape) dropOrphans(ctx context.Context, st *partitionState) (dropped []shape.Span, rows int64, err error) {
	type orphan struct {
		p    partitionInfo
		mark string
	}
	var orphans []orphan
	q, _ := l.db.Query(ctx, `SELECT c.relname::text, d.description, GREATEST(c.reltuples, 0)::bigint
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_description d ON d.objoid = c.oid
AND d.classoid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.objsubid = 0
WHERE c.relnamespace = (SELECT relnamespace FROM pg_catalog.pg_class WHERE oid = '`+l.table+`'::pg_catalog.regclass)
AND c.relkind = 'r' AND NOT c.relispartition AND d.description LIKE 'pgdedup: detached from %'
ORDER BY 1`)
	var o orphan
	if _, err := pgx.ForEachRow(q, []any{&o.p.name, &o.mark, &o.p.rows}, func() error {
		orphans = append(orphans, o)
		return nil
	}); err != nil {
		return nil, 0, fmt.Errorf("pgdedup: partitions of %s: find detached partitions: %w", l.table, shape.WithDetail(err))
	}
	for _, o := range orphans {
		bounds := o.mark[strings.LastIndex(o.mark, "; it held ")+len("; it held "):]
		f, t, _ := strings.Cut(bounds, " to ")
		from, err1 := time.Parse(time.RFC3339Nano, f)
		to, err2 := time.Parse(time.RFC3339Nano, t)
		if err1 != nil || err2 != nil || o.mark != detachMark(st.name, from, to) || o.p.name != partitionName(st.name, from) && o.p.name != partitionNameV1(st.name, from) {
			continue // not pgdedup's mark for this table
		}
		o.p.from, o.p.to = from, to
		if err := l.dropDetached(ctx, st, o.p); err != nil {
			if code, _ := shape.SQLState(err); code == "55P03" {
				l.log.InfoContext(ctx, "pgdedup: detached partition left to the next cleanup", "partition", o.p.name, "error", err)
				continue
			}
			return dropped, rows, err
		}
		dropped = append(dropped, shape.Span{Name: o.p.name, From: from.UTC(), To: to.UTC()})
		rows += o.p.rows
	}
	return dropped, rows, nil
}
