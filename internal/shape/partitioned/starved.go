package partitioned

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// Sealing waits for every transaction holding a lock on the table. One that
// stays open holds it up for as long. It may be idle in transaction, a
// stuck batch job or a forgotten prepared transaction. Meanwhile every
// claim inserts into one more partition per span. That is the partitioned
// shape's starved cleanup. Sealing has been due for a whole span or more,
// since the oldest unsealed partition ended, and this run's wait still
// finds transactions open. Cleanup then returns ErrCleanupStarved naming
// them, after doing the rest of its work. A pending DETACH … FINALIZE waits
// for the same transactions. One that holds it up for a span holds sealing
// up too.

// Partition creation takes no turn (createPartition). So no session can
// stop it by holding the cleaners' advisory lock. What holds it up is a
// lock on the table that ATTACH PARTITION (SHARE UPDATE EXCLUSIVE) or
// CREATE TABLE … LIKE waits for. That may be a long manual VACUUM, ANALYZE
// or CREATE INDEX CONCURRENTLY, or a transaction that locked the table in
// a stronger mode. The wait is a second more than another cleaner's detach
// may hold the lock (createLockTimeout, 6 s by default). After it the
// partition is left to the next run. The run returns ErrCleanupStarved
// naming the sessions, after doing the rest of its work. Claims fail only
// once the clock passes the last partition created. The first run after a
// partition fell due reports it, with the runway (Config.Runway, at least
// Ahead spans) still to go, less the time since the switch.

// cleanerCreating reports whether every session holding a lock on the table
// that creation waits for is a cleaner creating partitions. Such a session
// holds the cleaners' advisory lock too. createPartitionSQL takes it when
// free, after its lock on the table, which only roles that may change the
// table's rows can take.
func (l *Shape) cleanerCreating(ctx context.Context) bool {
	oid := `'` + l.table + `'::pg_catalog.regclass::pg_catalog.oid`
	var creating bool
	err := l.db.QueryRow(ctx, `WITH h AS (SELECT DISTINCT l.pid FROM pg_catalog.pg_locks l
WHERE l.locktype = 'relation' AND l.granted AND l.relation = `+oid+`
AND l.mode IN ('ShareUpdateExclusiveLock', 'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
AND l.pid IS DISTINCT FROM pg_catalog.pg_backend_pid())
SELECT count(*) > 0 AND coalesce(bool_and(EXISTS (SELECT FROM pg_catalog.pg_locks a WHERE a.pid = h.pid AND a.locktype = 'advisory'
AND a.granted AND a.classid = `+shape.CleanupLockClass+`::pg_catalog.oid AND a.objid = `+oid+` AND a.objsubid = 2)), false) FROM h`).Scan(&creating)
	return err == nil && creating
}

// creationStarved returns an error wrapping ErrCleanupStarved. The
// partitions blocked could not be created for a lock. st's partitions and
// made (this run's) say when claims would fail.
func (l *Shape) creationStarved(ctx context.Context, st *partitionState, made []shape.Span, blocked []string) error {
	var until time.Time
	for _, p := range st.parts {
		if p.to.After(until) {
			until = p.to
		}
	}
	for _, p := range made {
		if p.To.After(until) {
			until = p.To
		}
	}
	return fmt.Errorf("%w: creating partition(s) %s of %s waits for a lock held by %s: "+
		"claims fail once the clock passes the last partition, at %s; end it (pg_terminate_backend) if it is stuck",
		shape.ErrCleanupStarved, strings.Join(blocked, ", "), l.table, l.lockHolders(ctx), until.UTC().Format(time.RFC3339))
}

// sealStarved returns an error wrapping ErrCleanupStarved if sealing has
// been due for a span or more, and nil otherwise. It names the open
// transactions (virtualtransaction, from waitLockers) and the prepared ones
// (from Placement.WaitPrepared).
func (l *Shape) sealStarved(ctx context.Context, st *partitionState, open, prepared []string) error {
	if st.sealed.Add(2 * st.span).After(st.current) {
		return nil
	}
	if len(prepared) > 0 {
		// Every lock on the table is free, but a claim may still be
		// prepared on a node.
		return l.PreparedStarved(l.table, st.sealed.Add(st.span), prepared)
	}
	// A lock on the table counts, and so does the claims' advisory lock,
	// which a session of any role may hold.
	rows, _ := l.db.Query(ctx, `SELECT DISTINCT l.pid, coalesce(a.usename::text, '?'), coalesce(a.application_name, ''), coalesce(a.state, '?'), a.xact_start
FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE (l.locktype = 'relation' AND l.relation = '`+l.table+`'::pg_catalog.regclass::pg_catalog.oid
OR l.locktype = 'advisory' AND l.classid = `+ClaimLockClass+`::pg_catalog.oid
AND l.objid = '`+l.table+`'::pg_catalog.regclass::pg_catalog.oid AND l.objsubid = 2)
AND l.virtualtransaction = ANY ($1::text[])
ORDER BY 5 NULLS FIRST, 1`, open)
	var described []string
	var pid *int32
	var role, app, state string
	var since *time.Time
	_, err := pgx.ForEachRow(rows, []any{&pid, &role, &app, &state, &since}, func() error {
		described = append(described, describeSession(pid, role, app, state, since))
		return nil
	})
	who := strings.Join(described, ", ")
	if err != nil || len(described) == 0 {
		who = fmt.Sprintf("%d transaction(s) (%s)", len(open), strings.Join(open, ", "))
	}
	return fmt.Errorf("%w: sealing the partitions of %s, due since %s, is held up by %s, which hold a lock on the table: "+
		"until they end, each claim inserts into one more partition per span; end them (pg_terminate_backend) if they are stuck",
		shape.ErrCleanupStarved, l.table, st.sealed.Add(st.span).UTC().Format(time.RFC3339), who)
}

// describeSession describes a session holding a lock, for
// ErrCleanupStarved. It gives its pid, role, application_name, state and
// transaction start. A nil pid is a prepared transaction.
func describeSession(pid *int32, role, app, state string, since *time.Time) string {
	if pid == nil {
		return "a prepared transaction (pg_prepared_xacts)"
	}
	h := fmt.Sprintf("pid %d (role %s, application %q, %s", *pid, role, app, state)
	if since != nil {
		h += ", transaction since " + since.UTC().Format(time.RFC3339)
	}
	return h + ")"
}
