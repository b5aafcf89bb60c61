package partitioned

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// Long-lived rows on the partitioned layout. A partition goes only once all
// its rows have expired, and a few rows that live longer than the rest (a
// claim with WithRetention, an imported ID, a raw INSERT with a distant
// expires_at) would keep it. Cleanup skips such a partition and drops the
// ones after it that are due. It also carries the partition's live rows
// forward, so that they hold no old partition for long. It copies them
// into the newest sealed partition, where processed_at becomes that
// partition's start. It waits until no transaction has a snapshot older
// than the copy. Then it drops the old partition as any other. Exactness holds as before. A claim
// looks an ID up in every sealed partition, where it finds the copy. A
// claim whose snapshot predates the copy could miss it once the old
// partition is gone, which is why the old partition is detached only after
// every such snapshot has ended. A row with an absurd expires_at is carried
// along like this, about once per Retention, and so keeps at most one
// partition that would otherwise be dropped.
//
// A partition with more than carryMax live rows is kept as it is (its rows
// would be copied again and again). On a distributed table nothing is
// carried, and a partition with a live row is kept.

// carryMax is the most live rows Cleanup copies out of one partition.
const carryMax = 1000

// carryLive decides what becomes of p, a partition due to be dropped, given
// its live rows. It returns keep when p stays for now. That is so with too
// many live rows, no sealed partition after p to carry them to, a
// distributed table, or a snapshot older than the copy still open. Otherwise p's live rows have been copied and
// p.carried is set, and p may be detached.
func (l *Shape) carryLive(ctx context.Context, st *partitionState, p *partitionInfo) (keep bool, err error) {
	var live int
	if err := l.db.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+st.quoted(p.name)+` WHERE expires_at >= pg_catalog.now() LIMIT `+
		fmt.Sprint(carryMax+1)+`) x`).Scan(&live); err != nil {
		return true, fmt.Errorf("pgdedup: drop partition %s: %w", p.name, shape.WithDetail(err))
	}
	if live == 0 {
		return false, nil
	}
	q, ok := carryTarget(st, *p)
	if !ok || live > carryMax || st.distributed != "" || l.waits.NoCarry {
		l.log.InfoContext(ctx, "pgdedup: partition kept for its live rows", "partition", p.name, "live_rows", live)
		return true, nil
	}
	var cols string
	if err := l.db.QueryRow(ctx, `SELECT pg_catalog.string_agg(pg_catalog.quote_ident(attname), ', ' ORDER BY attnum)
FROM pg_catalog.pg_attribute WHERE attrelid = '`+l.table+`'::pg_catalog.regclass AND attnum > 0 AND NOT attisdropped
AND attname <> 'processed_at'`).Scan(&cols); err != nil {
		return true, fmt.Errorf("pgdedup: carry the live rows of %s: %w", p.name, shape.WithDetail(err))
	}
	// These are the live rows that have no copy after p yet. A run that
	// copied them but found old snapshots copies nothing again. FOR UPDATE
	// sees a Forget or a stored result that commits first. One that comes
	// later waits and then finds the copy too.
	after := p.to.UTC().Format(time.RFC3339Nano)
	copied := `SELECT 1 FROM ` + l.table + ` y WHERE y.key = x.key AND y.processed_at >= '` + after + `'::pg_catalog.timestamptz`
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`SELECT pg_catalog.set_config('lock_timeout', '2s', true)`)
	b.Queue(`INSERT INTO `+l.table+` (`+cols+`, processed_at)
SELECT `+cols+`, $1::pg_catalog.timestamptz FROM (SELECT * FROM `+st.quoted(p.name)+` x WHERE x.expires_at >= pg_catalog.now()
AND NOT EXISTS (`+copied+`) FOR UPDATE) x
ON CONFLICT DO NOTHING`, q.from)
	b.Queue(`COMMIT`)
	if err := l.db.SendBatch(ctx, b).Close(); err != nil {
		if code, _ := shape.SQLState(err); code == "55P03" || code == "40P01" {
			return true, nil // the next run tries again
		}
		return true, fmt.Errorf("pgdedup: carry the live rows of %s to %s: %w", p.name, q.name, shape.WithDetail(err))
	}
	// This is the newest copy's transaction. Every snapshot that may miss a
	// copy began before it committed.
	var xid string
	if err := l.db.QueryRow(ctx, `SELECT coalesce((SELECT y.xmin::pg_catalog.text FROM `+l.table+` y
WHERE y.processed_at >= '`+after+`'::pg_catalog.timestamptz
AND y.key IN (SELECT x.key FROM `+st.quoted(p.name)+` x WHERE x.expires_at >= pg_catalog.now())
ORDER BY pg_catalog.age(y.xmin) LIMIT 1), '')`).Scan(&xid); err != nil {
		return true, fmt.Errorf("pgdedup: carry the live rows of %s: %w", p.name, shape.WithDetail(err))
	}
	l.log.InfoContext(ctx, "pgdedup: live rows carried to a newer partition", "partition", p.name, "to", q.name, "rows", live)
	if xid != "" {
		old, err := l.waitSnapshots(ctx, xid, cmp.Or(l.waits.Detach, boundedWait(defaultDetachWait, st.span)))
		if err != nil || old > 0 {
			l.log.InfoContext(ctx, "pgdedup: drop waits for old snapshots", "partition", p.name, "open", old)
			return true, err
		}
	}
	p.carried = true
	return false, nil
}

// carryTarget is the partition the live rows of p go to. It is the newest
// sealed partition after it.
func carryTarget(st *partitionState, p partitionInfo) (partitionInfo, bool) {
	for i := len(st.parts) - 1; i >= 0; i-- {
		q := st.parts[i]
		if !q.pending && q.from.After(p.from) && !q.to.After(st.sealed) {
			return q, true
		}
	}
	return partitionInfo{}, false
}

// waitSnapshots waits up to d until no other session of the database has a
// snapshot that may not see the commit of transaction xid (its xmin is not
// after xid), polling pg_stat_activity, and returns how many still do.
func (l *Shape) waitSnapshots(ctx context.Context, xid string, d time.Duration) (int, error) {
	deadline := time.Now().Add(d)
	for pause := time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		var n int
		if err := l.db.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_stat_activity
WHERE datname = pg_catalog.current_database() AND pid <> pg_catalog.pg_backend_pid() AND backend_xmin IS NOT NULL
AND pg_catalog.age(backend_xmin) >= pg_catalog.age($1::text::pg_catalog.xid)`, xid).Scan(&n); err != nil {
			return 0, fmt.Errorf("pgdedup: partitions of %s: wait for old snapshots: %w", l.table, shape.WithDetail(err))
		}
		if n == 0 || time.Now().After(deadline) {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(pause):
		}
	}
}

// liveSQL is the query that finds a row of p that is live and, if p's
// rows were carried, not in the partitions after it (a row that came in
// since), which keeps p.
func liveSQL(st *partitionState, parent string, p partitionInfo) string {
	q := `SELECT EXISTS (SELECT 1 FROM ` + st.quoted(p.name) + ` x WHERE x.expires_at >= pg_catalog.now()`
	if p.carried {
		q += ` AND NOT EXISTS (SELECT 1 FROM ` + parent + ` y WHERE y.key = x.key AND y.processed_at >= '` +
			p.to.UTC().Format(time.RFC3339Nano) + `'::pg_catalog.timestamptz)`
	}
	return q + `)`
}
