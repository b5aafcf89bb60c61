package pgdedup

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Cleanup deletes the expired rows (expires_at passed) of every consumer in
// the table, not only the [Store]'s, and returns how many it deleted. It never
// deletes a row that has not expired, so an ID stays a duplicate for its whole
// [Config.Retention]. One cleaner per database is enough.
//
// It deletes in transactions of at most [Config.CleanupBatchSize] rows, each
// committed on its own, until a batch comes back short: no lock is held for
// long, and an interrupted Cleanup keeps the batches it committed. ctx is
// checked between batches and also cancels the batch in flight: Cleanup then
// returns ctx.Err() and the rows deleted by the batches it saw commit (the
// batch it interrupted may have committed too). Rows committed late by a long
// transaction, with an expires_at behind the run's progress, are left to the
// next run.
//
// Any number of Cleanups may run at once, from any process: they never wait
// for each other or deadlock, never wait on a claim, and one that finds
// another at work returns and leaves the rest to it. Once every one of a set
// of concurrent Cleanups has returned without error, no row that had expired
// before the first of them started is left (except rows committed late, as
// above). Cleanup keeps nothing in the session, so it works behind PgBouncer
// in transaction pooling mode, and needs only SELECT and DELETE on the table.
//
// Cleaners take turns through an advisory lock that any role able to connect
// could also take and hold. So a Cleanup that never gets the turn tells a
// cleaner at work from a session that just holds the turn: nobody is cleaning
// when the same sessions keep the turn while the oldest expired row stays.
// With [Config.CleanupTurnWait] it tries for that long and returns
// [ErrCleanupStarved], naming the sessions, if nobody cleaned meanwhile (and
// nil if another cleaner did); without, it returns nil at once, and the third
// run in a row (each at least a second after the one before) that saw
// nobody cleaning returns ErrCleanupStarved.
//
// Each run is logged ([Config.Logger]: info with the rows deleted and the
// duration, debug for each batch, a warning when it fails or is starved) and
// reported to [Config.OnEvent] as an [EventCleanup].
//
// On a table of the [LayoutPartitioned] layout Cleanup deletes no rows: it creates
// the partitions of the next spans, seals the older ones and detaches and
// drops those whose rows have all expired (docs/partitioning.md), logs what
// it created and dropped and reports them in the [Event] (Created,
// Dropped), and returns the rows of the dropped partitions (PostgreSQL's
// estimates). It then needs to own the table. A run stopped between a
// detach and its drop leaves a table that the next run drops. Transactions
// that hold a lock on the table and stay open keep partitions from being
// sealed: once sealing has been due for a partition span, Cleanup does the
// rest of its work and returns ErrCleanupStarved naming them. So does a
// session holding a lock that creating a partition waits for more than 6 s
// (a long VACUUM or CREATE INDEX CONCURRENTLY on the table): the first run
// after a partition fell due reports it, while the partitions ahead still
// last at least two spans. Partition creation takes no advisory lock.
func (s *Store) Cleanup(ctx context.Context) (deleted int64, err error) {
	start := time.Now()
	e := Event{Kind: EventCleanup}
	defer func() { s.cleanupDone(ctx, &e, deleted, time.Since(start), err) }()
	ls, err := s.layouts(ctx, pgxQueryRow(s.db))
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return 0, ctxErr
		}
		return 0, err // it names the table
	}
	giveUp := time.Now().Add(s.cfg.CleanupTurnWait)
	var first *turnSighting // the turn as seen by this run's first try
	for {
		deleted, skipped, err := ls.messages.cleanup(ctx, s, &e)
		if err != nil || !skipped {
			if err == nil {
				s.turn.reset()
			}
			return deleted, err
		}
		seen := s.sightTurn(ctx)
		if first == nil {
			first = &seen
		}
		if !time.Now().Before(giveUp) {
			return 0, s.turn.skipped(first, seen, s.cfg.CleanupTurnWait > 0)
		}
		t := time.NewTimer(min(time.Until(giveUp), jitter(100*time.Millisecond)))
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		case <-t.C:
		}
	}
}

// cleanupPlain is Cleanup on one PostgreSQL server: batches of rows picked in
// expires_at order and deleted by ctid, with turns taken as cleanupSQL says.
func (s *Store) cleanupPlain(ctx context.Context) (deleted int64, skipped bool, err error) {
	turnSQL, deleteSQL := s.cleanupSQL()
	batch := int64(s.cfg.CleanupBatchSize)
	from := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	for first := true; ; first = false {
		if err := ctx.Err(); err != nil {
			return deleted, false, err
		}
		t0 := time.Now()
		turn, n, err := s.cleanupBatch(ctx, turnSQL, deleteSQL, batch, &from)
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return deleted, false, ctxErr
			}
			return deleted, false, fmt.Errorf("pgdedup: cleanup of %s: %w", s.messages.table, withDetail(err))
		}
		deleted += n
		s.log.DebugContext(ctx, "pgdedup: cleanup batch", "deleted", n, "turn", turn, "duration", time.Since(t0))
		// Without the turn, another cleaner holds it: it was given the turn
		// after this one's last batch committed, so it sees everything this one
		// deleted and goes on until its own batch comes back short. With the
		// turn, a short batch means nothing expired is left from *from on, as
		// of a snapshot taken after the turn was held.
		if !turn || n < batch {
			return deleted, first && !turn, nil
		}
	}
}

// cleanupBatch sends one batch's two statements (see cleanupSQL) in one round
// trip and one implicit transaction. It reports whether this cleaner had the
// turn and how many rows it deleted, and moves *from to where the next batch
// starts.
func (s *Store) cleanupBatch(ctx context.Context, turnSQL, deleteSQL string, batch int64, from *pgtype.Timestamptz) (turn bool, n int64, err error) {
	b := &pgx.Batch{}
	b.Queue(turnSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&turn) })
	b.Queue(deleteSQL, batch, *from).QueryRow(func(row pgx.Row) error { return row.Scan(&n, from) })
	return turn, n, s.db.SendBatch(ctx, b).Close()
}

// cleanupSQL returns the two statements of a batch, sent together as one pgx
// batch: one round trip, and one implicit transaction (no BEGIN, nothing left
// in the session; the same with pgx's simple protocol, where they go as one
// multi-statement query).
//
// The first takes this batch's turn: concurrent cleaners take turns through a
// transaction-scoped advisory lock (keyed by the table's OID), tried once per
// batch and kept, with the answer, until the transaction ends. A batch that
// does not get it deletes nothing, and its Cleanup leaves the rest to the
// cleaner at work. So cleaners never wait for each other, the lock ends with
// each batch's transaction (PgBouncer-safe), and, unlike FOR UPDATE SKIP
// LOCKED, no UPDATE privilege is needed: SELECT and DELETE are enough. Claims
// never wait on a cleaner except for an expired ID redelivered while its row
// is being deleted, and a cleaner never waits on a claim (ON CONFLICT DO
// NOTHING locks nothing).
//
// The turn is taken in a statement of its own, before the DELETE, because in
// READ COMMITTED each statement takes its snapshot when it starts: a DELETE
// that tried the lock itself would pick its rows from a snapshot older than
// its turn, could miss the last batch committed by the cleaner before it,
// delete less than a batch, and end its run while that cleaner, finding the
// turn taken, ended its own: both gone, expired rows left. Here the DELETE's
// snapshot is taken with the turn held, so it sees every batch committed
// before.
//
// The second deletes the oldest expired rows from expires_at $2 on, if the
// turn was taken (a constant condition: without the turn no index is read).
// It returns how many it deleted and the latest expires_at among them, where
// the next batch starts, so that no batch walks again over the index entries
// of the rows deleted before it: until vacuum removes them (and it cannot
// while any older transaction is open) every scan from the start of the index
// would visit them all, and a long Cleanup would slow down batch after batch.
// The rows are found through the expires_at index and deleted by ctid (a TID
// scan, no second index lookup); the DELETE checks expires_at again.
func (s *Store) cleanupSQL() (turn, del string) {
	t := s.messages.table
	turn = `SELECT set_config('` + cleanupTurnSetting + `', pg_try_advisory_xact_lock(` +
		cleanupLockClass + `, '` + t + `'::regclass::oid::int4)::text, true)::boolean`
	del = `WITH deleted AS (
DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(
SELECT ctid FROM ` + t + ` WHERE current_setting('` + cleanupTurnSetting + `', true) = 'true'
AND expires_at < now() AND expires_at >= $2
ORDER BY expires_at LIMIT $1))
AND expires_at < now()
RETURNING expires_at)
SELECT count(*), coalesce(max(expires_at), $2) FROM deleted`
	return turn, del
}

// cleanupLockClass is the first half of the cleaners' advisory lock key ("pgdd"
// in ASCII); the second is the table's OID, so cleaners of different tables, or
// of same-named tables in different schemas, never take turns.
const cleanupLockClass = "1885824100"

// cleanupTurnSetting holds, until a batch's transaction ends (set_config's
// is_local), whether that batch got the turn.
const cleanupTurnSetting = "pgdedup.cleanup_turn"

// cleanupDone logs and reports one Cleanup run. A run stopped by its context
// (a service shutting down) is not a failure worth a warning.
func (s *Store) cleanupDone(ctx context.Context, e *Event, deleted int64, d time.Duration, err error) {
	switch {
	case err == nil:
		s.log.InfoContext(ctx, "pgdedup: cleanup", "table", s.messages.table, "deleted", deleted, "duration", d)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		s.log.InfoContext(ctx, "pgdedup: cleanup stopped", "table", s.messages.table, "deleted", deleted, "duration", d, "error", err)
	default:
		s.log.WarnContext(ctx, "pgdedup: cleanup failed", "table", s.messages.table, "deleted", deleted, "duration", d, "error", err)
	}
	e.Count, e.Duration, e.Err = deleted, d, err
	s.emit(ctx, *e)
}

// MinCleanerInterval is the shortest interval [Store.RunCleaner] accepts: a
// bare number (3600, meaning 3600ns) is refused rather than run as a busy loop.
const MinCleanerInterval = time.Millisecond

// RunCleaner runs [Store.Cleanup] about every interval until ctx is done, then returns
// ctx.Err(); it blocks, so start it in a goroutine of its own and cancel ctx to
// stop it. On the [LayoutPartitioned] layout, given a pool, it also creates the
// partitions ahead every interval on a goroutine of its own, so that
// creation never waits behind a run held up sealing or detaching; that
// goroutine has ended when RunCleaner returns.
//
// The first run comes after a random delay of up to one interval, and each wait
// after a run is interval ±10%, so a fleet of services started together does
// not clean in step. A failed run is logged ([Config.Logger]) and reported
// ([Config.OnEvent]) and the next one comes at the next tick: a database outage
// does not end the loop. Run it in every instance, or in one: concurrent
// cleaners are safe and skip each other's rows.
//
// Pick interval well below Retention (an hour is a good start); a cleanup that
// finds nothing to delete costs one index probe. An interval below
// [MinCleanerInterval] is an error.
func (s *Store) RunCleaner(ctx context.Context, interval time.Duration) error {
	if interval < MinCleanerInterval {
		return fmt.Errorf("pgdedup: RunCleaner interval must be at least %s, got %s: a Duration counts nanoseconds (write time.Hour, not 3600)", MinCleanerInterval, interval)
	}
	defer s.createAhead(ctx, interval)() // partition_ahead.go
	t := time.NewTimer(rand.N(interval) + 1)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		_, _ = s.Cleanup(ctx) // logged and reported by Cleanup
		t.Reset(jitter(interval))
	}
}

// jitter returns d ±10%, uniformly.
func jitter(d time.Duration) time.Duration {
	spread := d / 5
	if spread <= 0 {
		return d
	}
	return d - spread/2 + rand.N(spread)
}
