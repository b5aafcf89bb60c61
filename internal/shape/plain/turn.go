package plain

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// Cleaners take turns through a transaction-scoped advisory lock (see
// cleanupSQL), which any role able to connect could take and hold. A
// Cleanup that finds the turn taken returns and leaves the work to whoever
// holds it. This file decides when that has gone on too long. Nobody is
// cleaning when the same sessions kept the turn across runs while the
// oldest expired row stayed where it was.

// Sighting is what a Cleanup that found the turn taken saw.
type Sighting struct {
	at      time.Time
	holders []string // the transactions holding the cleaners' lock (pid and start), sorted
	working bool     // a holder is running a cleaner's statement
	// released is set when the holders were read and there were none. The
	// turn this run found taken has been let go since.
	released bool
	oldest   *time.Time // the oldest expired row's expires_at, or nil if none
	about    string     // the holders, described for an error
}

// progressSince reports whether a cleaner made progress between before and
// s, or is making it. That is so when the turn was let go, or passed to
// another transaction, or a holder is running a cleaner's statement, or the
// oldest expired row was deleted. On Citus a cleaner gives the turn back
// without deleting while it narrows its windows. Behind PgBouncer a
// cleaner's next batch may run on the same server session, so a
// transaction is told by its start as well as its pid. One batch may take
// longer than a wait.
func (s Sighting) progressSince(before Sighting) bool {
	switch {
	case s.oldest == nil || s.working || s.released:
		return true // nothing expired is left, a cleaner is at work, or the turn was let go
	case before.oldest == nil || !slices.Equal(s.holders, before.holders):
		return true
	}
	return s.oldest.After(*before.oldest)
}

// TurnWatch counts a Store's Cleanup runs in a row that found the turn
// taken with no progress between them. The runs counted are at least
// turnRunSpacing apart, since runs closer together may all fall within one
// long batch of a working cleaner.
type TurnWatch struct {
	mu   sync.Mutex
	runs int
	last Sighting
}

// The starvation rule is turnRunsStarved runs in a row, each at least
// turnRunSpacing after the one before.
const (
	turnRunsStarved = 3
	turnRunSpacing  = time.Second
)

// Reset records a run that had the turn.
func (w *TurnWatch) Reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.runs = 0
}

// Skipped records a run that never had the turn. first is what it saw at
// its first try, and seen what it saw at its last. It returns an error
// wrapping ErrCleanupStarved if nobody is cleaning. With waited, that is
// when no cleaner made progress during the run's wait. Without, it is the
// third run in a row without progress.
func (w *TurnWatch) Skipped(first *Sighting, seen Sighting, waited bool) error {
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
		return fmt.Errorf("%w: %d runs in a row found %s", shape.ErrCleanupStarved, w.runs, seen.about)
	}
	return nil
}

// SightTurn reads who holds the cleaners' lock on table, and the oldest
// expired row. It reads pg_locks and pg_stat_activity, whose details of
// other roles' sessions need pg_read_all_stats. The pid and role are always
// there. A failed read is reported in about and counts as no progress.
func SightTurn(ctx context.Context, db shape.DB, table string) Sighting {
	seen := Sighting{at: time.Now()}
	// A holder at work runs one of cleanupSQL's statements, which both name
	// CleanupTurnSetting. Or it runs a statement of a Citus cleaner's window,
	// which all begin with a comment naming it, or it is between them. Or it
	// is ending its transaction. A COMMIT on Citus is a two-phase commit
	// across the workers, which may take longer than a wait. A query's text
	// is visible to the same role and to pg_read_all_stats. Otherwise that
	// sign is missing and the others count.
	rows, err := db.Query(ctx, `SELECT l.pid, coalesce(a.usename::text, '?'), coalesce(a.state, '?'), a.xact_start,
coalesce(pg_catalog.strpos(a.query, '`+shape.CleanupTurnSetting+`') > 0 AND (a.state = 'active'
OR a.state = 'idle in transaction' AND a.state_change > pg_catalog.clock_timestamp() - interval '1 second')
OR a.state = 'active' AND pg_catalog.lower(pg_catalog.btrim(a.query, E' \n;')) IN ('commit', 'rollback'), false)
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.classid = `+shape.CleanupLockClass+`::oid
AND l.objid = '`+table+`'::regclass::oid AND l.objsubid = 2 ORDER BY l.pid`)
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
		err = db.QueryRow(ctx, `SELECT min(expires_at) FROM `+table+` WHERE expires_at < now()`).Scan(&seen.oldest)
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
			table, shape.CleanupLockClass, strings.Join(described, ", "))
	}
	return seen
}
