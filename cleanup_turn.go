package pgdedup

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cleaners take turns through a transaction-scoped advisory lock (see
// cleanupSQL), which any role able to connect could take and hold. A
// Cleanup that finds the turn taken returns and leaves the work to whoever
// holds it; this file decides when that has gone on too long: when the same
// sessions kept the turn across runs while the oldest expired row stayed
// where it was, nobody is cleaning.

// turnSighting is what a Cleanup that found the turn taken saw.
type turnSighting struct {
	at      time.Time
	holders []string // the transactions holding the cleaners' lock (pid and start), sorted
	working bool     // a holder is running a cleaner's statement
	// released: the holders were read and there were none: the turn this
	// run found taken has been let go since (a cleaner's batch ended)
	released bool
	oldest   *time.Time // the oldest expired row's expires_at; nil if none
	about    string     // the holders, described for an error
}

// progressSince reports whether a cleaner made progress between before and
// s, or is making it: the turn was let go (on Citus a cleaner holds it for
// windows it counts and gives back without deleting while it narrows them),
// or passed to another transaction (behind PgBouncer, a cleaner's next batch
// may run on the same server session, so a transaction is told by its start
// as well as its pid), a holder is running a cleaner's statement (one batch
// may take longer than a wait), or the oldest expired row was deleted.
func (s turnSighting) progressSince(before turnSighting) bool {
	switch {
	case s.oldest == nil || s.working || s.released:
		return true // nothing expired is left, a cleaner is at work, or the turn was let go
	case before.oldest == nil || !slices.Equal(s.holders, before.holders):
		return true
	}
	return s.oldest.After(*before.oldest)
}

// turnWatch counts a Store's Cleanup runs in a row that found the turn taken
// with no progress between them, at least turnRunSpacing apart (runs
// closer together may all fall within one long batch of a working cleaner).
type turnWatch struct {
	mu   sync.Mutex
	runs int
	last turnSighting
}

// The starvation rule: turnRunsStarved runs in a row, each at least
// turnRunSpacing after the one before.
const (
	turnRunsStarved = 3
	turnRunSpacing  = time.Second
)

func (w *turnWatch) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.runs = 0
}

// skipped records a run that never had the turn (first: at its first try,
// seen: at its last) and returns ErrCleanupStarved if nobody is cleaning:
// with waited, if no cleaner made progress during the run's wait; without,
// on the third run in a row without progress.
func (w *turnWatch) skipped(first *turnSighting, seen turnSighting, waited bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if waited && seen.progressSince(*first) || !waited && w.runs > 0 && seen.progressSince(w.last) {
		w.runs = 0
	}
	if seen.oldest == nil {
		return nil // nothing to clean: no harm done
	}
	if w.runs == 0 || seen.at.Sub(w.last.at) >= turnRunSpacing {
		w.runs++
		w.last = seen
	}
	if waited && !seen.progressSince(*first) || w.runs >= turnRunsStarved {
		return fmt.Errorf("%w: %d runs in a row found %s", ErrCleanupStarved, w.runs, seen.about)
	}
	return nil
}

// sightTurn reads who holds the cleaners' lock on the table, from pg_locks and
// pg_stat_activity (whose details of other roles' sessions need
// pg_read_all_stats; the pid and role are always there), and the oldest
// expired row. A failed read is reported in about and counts as no progress.
func (s *Store) sightTurn(ctx context.Context) turnSighting {
	seen := turnSighting{at: time.Now()}
	// A holder at work runs one of cleanupSQL's statements, which both name
	// cleanupTurnSetting; or one of a Citus cleaner's window, which all begin
	// with citusCleanerMark, or is between them; or is ending its transaction
	// (a COMMIT on Citus is a two-phase commit across the workers, which may
	// take longer than a wait). A query's text is visible to the same role and
	// to pg_read_all_stats; otherwise that sign is missing and the others count.
	rows, err := s.db.Query(ctx, `SELECT l.pid, coalesce(a.usename::text, '?'), coalesce(a.state, '?'), a.xact_start,
coalesce(pg_catalog.strpos(a.query, '`+cleanupTurnSetting+`') > 0 AND (a.state = 'active'
OR a.state = 'idle in transaction' AND a.state_change > pg_catalog.clock_timestamp() - interval '1 second')
OR a.state = 'active' AND pg_catalog.lower(pg_catalog.btrim(a.query, E' \n;')) IN ('commit', 'rollback'), false)
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.classid = `+cleanupLockClass+`::oid
AND l.objid = '`+s.messages.table+`'::regclass::oid AND l.objsubid = 2 ORDER BY l.pid`)
	var described []string
	if err == nil {
		var pid int32
		var role, state string
		var since *time.Time
		var working bool
		_, err = pgx.ForEachRow(rows, []any{&pid, &role, &state, &since, &working}, func() error {
			holder := fmt.Sprint(pid)
			if since != nil {
				holder += "@" + since.UTC().Format(time.RFC3339Nano)
			}
			seen.holders = append(seen.holders, holder)
			seen.working = seen.working || working
			h := fmt.Sprintf("pid %d (role %s, %s", pid, role, state)
			if since != nil {
				h += ", transaction since " + since.UTC().Format(time.RFC3339)
			}
			described = append(described, h+")")
			return nil
		})
	}
	if err == nil {
		err = s.db.QueryRow(ctx, `SELECT min(expires_at) FROM `+s.messages.table+` WHERE expires_at < now()`).Scan(&seen.oldest)
	}
	switch {
	case err != nil:
		seen.about = "the cleaners' turn taken (its holder could not be read: " + err.Error() + ")"
		seen.oldest = &seen.at
	case len(described) == 0:
		seen.released = true
		seen.about = "the cleaners' turn taken by a session that has let it go since"
	default:
		seen.about = fmt.Sprintf("the cleaners' advisory lock on %s (%s, the table's OID) held by %s, and no expired row deleted; "+
			"if that is not a cleaner, end it (pg_terminate_backend) and REVOKE CONNECT from roles that need none",
			s.messages.table, cleanupLockClass, strings.Join(described, ", "))
	}
	return seen
}
