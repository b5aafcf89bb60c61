package pgdedup

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pgdedup/pgdedup/internal/engine"
	"github.com/pgdedup/pgdedup/internal/shape"
	"github.com/pgdedup/pgdedup/internal/shape/plain"
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
	ls, err := s.layouts(ctx, engine.PgxQueryRow(s.db))
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return 0, ctxErr
		}
		return 0, err // it names the table
	}
	giveUp := time.Now().Add(s.cfg.CleanupTurnWait)
	var first *plain.Sighting // the turn as seen by this run's first try
	for {
		deleted, skipped, err := cleanupShape(ctx, ls.Messages, &e)
		if err != nil || !skipped {
			if err == nil {
				s.turn.Reset()
			}
			return deleted, err
		}
		seen := plain.SightTurn(ctx, s.db, s.messages.table)
		if first == nil {
			first = &seen
		}
		if !time.Now().Before(giveUp) {
			return 0, s.turn.Skipped(first, seen, s.cfg.CleanupTurnWait > 0)
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
	defer s.createAhead(ctx, interval)() // layout.go
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
func jitter(d time.Duration) time.Duration { return shape.Jitter(d) }

// cleanupShape deletes sh's expired rows (see Store.Cleanup). skipped reports that
// it never had the cleaners' turn. It adds the partitions it created and
// dropped to e.
func cleanupShape(ctx context.Context, sh shape.Shape, e *Event) (deleted int64, skipped bool, err error) {
	var r shape.Report
	deleted, skipped, err = sh.Cleanup(ctx, &r)
	e.Created, e.Dropped = spans(r.Created), spans(r.Dropped)
	return deleted, skipped, err
}

func spans(in []shape.Span) []PartitionSpan {
	if in == nil {
		return nil
	}
	out := make([]PartitionSpan, len(in))
	for i, p := range in {
		out[i] = PartitionSpan(p)
	}
	return out
}
