package pgdedup

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Sealing waits for every transaction holding a lock on the table; one that
// stays open (idle in transaction, a stuck batch job, a forgotten prepared
// transaction) holds it up for as long, and meanwhile every claim inserts
// into one more partition per span. That is the partitioned layout's
// starved cleanup: sealing due (the oldest unsealed partition ended) for a
// whole span or more, and this run's wait still finding transactions open.
// Cleanup then returns ErrCleanupStarved naming them, after doing the rest
// of its work. A pending DETACH … FINALIZE waits for the same transactions:
// one that holds it up for a span holds sealing up too.

// sealStarved returns an error wrapping ErrCleanupStarved, naming the open
// transactions (virtualtransaction, from waitLockers) and the prepared ones
// on Citus's nodes (described by waitPrepared), if sealing has been due for a
// span or more; nil otherwise.
func (s *Store) sealStarved(ctx context.Context, st *partitionState, open, prepared []string) error {
	if st.sealed.Add(2 * st.span).After(st.current) {
		return nil
	}
	if len(prepared) > 0 {
		// Citus: every lock on the table is free; a claim may still be
		// prepared on a node (partition_prepared.go).
		return fmt.Errorf("%w: sealing the partitions of %s, due since %s, is held up by %s, which may hold a claim "+
			"that two-phase commit has not finished on that node: Citus's recovery ends them (recover_prepared_transactions()); "+
			"until they end, each claim inserts into one more partition per span",
			ErrCleanupStarved, s.messages.table, st.sealed.Add(st.span).UTC().Format(time.RFC3339), strings.Join(prepared, ", "))
	}
	rows, _ := s.db.Query(ctx, `SELECT DISTINCT l.pid, coalesce(a.usename::text, '?'), coalesce(a.state, '?'), a.xact_start
FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.relation = '`+s.messages.table+`'::pg_catalog.regclass::pg_catalog.oid
AND l.virtualtransaction = ANY ($1::text[])
ORDER BY 4 NULLS FIRST, 1`, open)
	var described []string
	var pid *int32
	var role, state string
	var since *time.Time
	_, err := pgx.ForEachRow(rows, []any{&pid, &role, &state, &since}, func() error {
		if pid == nil {
			described = append(described, "a prepared transaction (pg_prepared_xacts)")
			return nil
		}
		h := fmt.Sprintf("pid %d (role %s, %s", *pid, role, state)
		if since != nil {
			h += ", transaction since " + since.UTC().Format(time.RFC3339)
		}
		described = append(described, h+")")
		return nil
	})
	who := strings.Join(described, ", ")
	if err != nil || len(described) == 0 {
		who = fmt.Sprintf("%d transaction(s) (%s)", len(open), strings.Join(open, ", "))
	}
	return fmt.Errorf("%w: sealing the partitions of %s, due since %s, is held up by %s, which hold a lock on the table: "+
		"until they end, each claim inserts into one more partition per span; end them (pg_terminate_backend) if they are stuck",
		ErrCleanupStarved, s.messages.table, st.sealed.Add(st.span).UTC().Format(time.RFC3339), who)
}
