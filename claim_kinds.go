package pgdedup

import (
	"context"
	"fmt"
	"time"

	"github.com/pgdedup/pgdedup/internal/engine"
	"github.com/pgdedup/pgdedup/internal/shape"
)

// This file builds the engine's claims from the calls' arguments. They are
// one message ID, a batch of IDs, and a topic partition's offsets. The engine
// (internal/engine) sends their statements and then reads their outcome. The
// calls themselves live in processed.go (own transaction), tx.go (the
// caller's pgx transaction) and databasesql.go (the caller's database/sql
// transaction).

// newEngine returns the engine that sends s's claims.
func newEngine(s *Store) *engine.Engine {
	return &engine.Engine{DB: s.db, Consumer: s.cfg.Consumer, TxOptions: s.cfg.TxOptions, MaxAttempts: s.cfg.MaxAttempts,
		Log: s.log, Emit: func(ctx context.Context, e engine.Event) {
			s.emit(ctx, Event{Kind: EventKind(e.Kind), MessageID: e.MessageID, Count: e.Count, Attempt: e.Attempt, Duration: e.Duration, Err: e.Err})
		},
		Layouts: func(ctx context.Context, q engine.QueryRow) (*engine.Layouts, error) {
			ls, err := s.layouts(ctx, q)
			if err != nil {
				return nil, err
			}
			return &ls.Layouts, nil
		},
		Table: s.messages.table, Offsets: s.offsets, LockTimeoutMS: s.messages.lockTimeoutMS}
}

// emit reports e to Config.OnEvent, if set.
func (s *Store) emit(ctx context.Context, e Event) {
	if s.cfg.OnEvent != nil {
		e.Consumer = s.cfg.Consumer
		s.cfg.OnEvent(ctx, e)
	}
}

// id is the ID of a claim, with its consumer and key.
func (s *Store) id(messageID string) shape.ID {
	return shape.ID{Consumer: s.cfg.Consumer, ID: messageID, Key: Key(s.cfg.Consumer, messageID)}
}

// newIDClaim validates messageID and the options that call, the name of the
// exported method, was given. It returns their claim and the options.
func (s *Store) newIDClaim(call, messageID string, opts []Option) (*engine.IDClaim, callOptions, error) {
	if err := ValidateMessageID(messageID); err != nil {
		return nil, callOptions{}, err
	}
	o, err := s.cfg.callOptions(call, opts)
	if err != nil {
		return nil, callOptions{}, err
	}
	var since time.Time
	if !o.sentAt.IsZero() {
		since = o.sentAt.Add(-s.cfg.SentAtMargin)
	}
	return &engine.IDClaim{ID: s.id(messageID), Retention: o.retention, Fingerprint: o.fingerprint, WithResult: call == callProcessResult,
		Since: since, Mismatch: func(stored []byte) error {
			return &PayloadMismatchError{MessageID: messageID, Stored: stored, Given: o.fingerprint}
		}}, o, nil
}

// newBatchClaim validates ids and opts, and prepares their claim. A batch
// takes [WithSentAt] only: the earliest first-sent time of its messages.
func (s *Store) newBatchClaim(call string, ids []string, opts []Option) (*engine.BatchClaim, error) {
	o, err := s.cfg.callOptions(call, opts)
	switch {
	case err != nil:
		return nil, err
	case o.fingerprint != nil || o.retention != 0:
		return nil, fmt.Errorf("%w: %s takes WithSentAt only (no fingerprint, no retention per batch)", ErrInvalidOption, call)
	}
	sorted, err := prepareBatch(s.cfg.Consumer, ids, s.cfg.MaxBatch)
	if err != nil {
		return nil, err
	}
	c := &engine.BatchClaim{Consumer: s.cfg.Consumer, IDs: ids, Sorted: sorted.ids, Keys: sorted.keys}
	if !o.sentAt.IsZero() {
		c.Since = o.sentAt.Add(-s.cfg.SentAtMargin)
	}
	return c, nil
}

// newOffsetsClaim prepares the claim of p's offsets, which are validated.
func (s *Store) newOffsetsClaim(p TopicPartition, offsets []int64) *engine.OffsetsClaim {
	return &engine.OffsetsClaim{Consumer: s.cfg.Consumer, Topic: p.Topic, Partition: p.Partition, Generation: p.Generation,
		Offsets: offsets, SQL: s.offsets}
}

// claimID is Claim and ClaimSQL. It validates messageID and opts, and then
// run claims the ID in the caller's transaction.
func (s *Store) claimID(call, messageID string, opts []Option, run func(engine.Claim) error) (claimed bool, err error) {
	c, _, err := s.newIDClaim(call, messageID, opts)
	if err != nil {
		return false, err
	}
	if err := run(c); err != nil {
		return false, err
	}
	return c.Claimed, nil
}

// claimBatch is ClaimBatch and ClaimBatchSQL. It validates messageIDs, and
// then run claims them in the caller's transaction.
func (s *Store) claimBatch(call string, messageIDs []string, opts []Option, run func(engine.Claim) error) (fresh []string, err error) {
	c, err := s.newBatchClaim(call, messageIDs, opts)
	if err != nil || len(c.Sorted) == 0 {
		return nil, err
	}
	if err := run(c); err != nil {
		return nil, err
	}
	return c.FreshIDs(), nil
}

// claimOffsets is ClaimOffsets and ClaimOffsetsSQL. It validates p and
// offsets, and then run claims them in the caller's transaction.
func (s *Store) claimOffsets(p TopicPartition, offsets []int64, run func(engine.Claim) error) (fresh []int64, err error) {
	if err := validateOffsets(p, offsets); err != nil || len(offsets) == 0 {
		return nil, err
	}
	c := s.newOffsetsClaim(p, offsets)
	if err := run(c); err != nil {
		return nil, err
	}
	return c.FreshOffsets(), nil
}
