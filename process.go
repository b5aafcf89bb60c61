package pgdedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Process runs fn exactly once per messageID for the [Store]'s consumer, in one
// transaction with the claim of the ID, and reports whether it ran.
//
// BEGIN and the claim go to Postgres in one round trip. If the ID is new, fn
// runs in the transaction, which then commits: the business write and the ID
// are recorded together or not at all. A duplicate returns (false, nil) without
// calling fn. Either way a nil error means the message is done: ack it.
//
// If fn returns an error, the transaction rolls back, the ID is not recorded
// and the error is returned as is (errors.Is works); if fn panics, the
// transaction rolls back and the panic continues. fn must not commit or roll
// back tx itself (use tx.Begin for a savepoint). Keep fn's side effects inside
// tx: fn may run again after a rolled-back attempt.
//
// Failures of the database (see [IsTransient]: a serialization failure or
// deadlock, the connection lost under the claim, under fn's transaction or
// during COMMIT) are retried up to [Config.MaxAttempts], with jittered backoff.
// Any other error fn returns, such as an HTTP client's error or a decoder's
// io.EOF, comes back after one attempt, whatever its type: pgdedup cannot know
// whether what fn called acted on the request. After a connection lost during COMMIT the outcome is unknown; the
// retry finds the ID if that commit landed and then reports a duplicate, so
// processed may be false for a message whose effects this call committed.
func (s *Store) Process(ctx context.Context, messageID string, fn func(ctx context.Context, tx pgx.Tx) error) (processed bool, err error) {
	if err := ValidateMessageID(messageID); err != nil {
		return false, err
	}
	if fn == nil {
		return false, errNilFunc
	}
	err = s.retry(ctx, messageID, func() error {
		var err error
		processed, err = s.processOnce(ctx, messageID, fn)
		return err
	})
	return processed, err
}

func (s *Store) processOnce(ctx context.Context, id string, fn func(context.Context, pgx.Tx) error) (bool, error) {
	start := time.Now()
	a, err := s.singleAround(ctx, pgxQueryRow(s.db))
	if err != nil {
		return false, err
	}
	br, tx := s.beginWith(ctx, func(b *pgx.Batch) { queueAround(b, a, s.sql.claim, s.cfg.Consumer, id, Key(s.cfg.Consumer, id)) })
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit; on failure pgx closes the connection

	claimed, err := s.readClaim(br, id, true, a)
	if err != nil {
		s.inFlight(ctx, err, id, 1)
		return false, err
	}
	if !claimed {
		s.duplicate(ctx, id, 1)
		return false, tx.Rollback(ctx)
	}
	if err := fn(ctx, tx); err != nil {
		return false, fromFn(tx, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fromDatabase(fmt.Errorf("pgdedup: commit %q: %w", id, withDetail(err)))
	}
	s.emit(ctx, Event{Kind: EventProcessed, MessageID: id, Count: 1, Duration: time.Since(start)})
	return true, nil
}

// ProcessBatch is [Store.Process] for many messages at once: one transaction claims all
// of messageIDs (one statement, whatever the count) and runs fn once with the
// IDs that are new, in the order they first appear in messageIDs. When none is
// new, fn is not called and fresh is empty. fn must handle exactly the fresh
// messages: their IDs are recorded when the transaction commits.
//
// Errors, panics and retries behave as in Process. If any ID is invalid, the
// whole batch is rejected with [ErrInvalidMessageID], naming its index, before
// anything is sent.
func (s *Store) ProcessBatch(ctx context.Context, messageIDs []string, fn func(ctx context.Context, tx pgx.Tx, fresh []string) error) (fresh []string, err error) {
	sorted, err := prepareBatch(s.cfg.Consumer, messageIDs)
	if err != nil || len(sorted.ids) == 0 {
		return nil, err
	}
	if fn == nil {
		return nil, errNilFunc
	}
	err = s.retry(ctx, "", func() error {
		var err error
		fresh, err = s.processBatchOnce(ctx, messageIDs, sorted, fn)
		return err
	})
	return fresh, err
}

func (s *Store) processBatchOnce(ctx context.Context, ids []string, sorted sortedBatch, fn func(context.Context, pgx.Tx, []string) error) ([]string, error) {
	start := time.Now()
	l, err := s.layout(ctx, pgxQueryRow(s.db))
	if err != nil {
		return nil, err
	}
	var q queuedBatch
	br, tx := s.beginWith(ctx, func(b *pgx.Batch) { q = s.queueClaimBatch(b, l, sorted) })
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit; on failure pgx closes the connection

	fresh, err := s.readClaimBatch(br, ids, true, q)
	if err != nil {
		s.inFlight(ctx, err, "", len(sorted.ids))
		return nil, err
	}
	if dups := len(sorted.ids) - len(fresh); dups > 0 {
		s.duplicate(ctx, "", dups)
	}
	if len(fresh) == 0 {
		return nil, tx.Rollback(ctx)
	}
	if err := fn(ctx, tx, fresh); err != nil {
		return nil, fromFn(tx, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fromDatabase(fmt.Errorf("pgdedup: commit batch: %w", withDetail(err)))
	}
	s.emit(ctx, Event{Kind: EventProcessed, Count: int64(len(fresh)), Duration: time.Since(start)})
	return fresh, nil
}

// beginWith sends BEGIN and the statements queue adds in one round trip and
// returns their results and the transaction. The caller reads the results,
// then owns tx: it must commit or roll it back, even when reading failed.
func (s *Store) beginWith(ctx context.Context, queue func(*pgx.Batch)) (pgx.BatchResults, pgx.Tx) {
	b := &pgx.Batch{}
	b.BeginTx(s.cfg.TxOptions)
	queue(b)
	br := s.db.SendBatch(ctx, b)
	return br, br.Tx()
}

func (s *Store) duplicate(ctx context.Context, id string, n int) {
	if id != "" {
		s.log.DebugContext(ctx, "pgdedup: skipped duplicate", "consumer", s.cfg.Consumer, "message_id", id)
	} else {
		s.log.DebugContext(ctx, "pgdedup: skipped duplicates", "consumer", s.cfg.Consumer, "count", n)
	}
	s.emit(ctx, Event{Kind: EventDuplicate, MessageID: id, Count: int64(n)})
}

func (s *Store) inFlight(ctx context.Context, err error, id string, n int) {
	if errors.Is(err, ErrInFlight) {
		s.log.DebugContext(ctx, "pgdedup: message in flight elsewhere", "consumer", s.cfg.Consumer, "message_id", id)
		s.emit(ctx, Event{Kind: EventInFlight, MessageID: id, Count: int64(n)})
	}
}
