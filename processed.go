package pgdedup

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/shape/partitioned"
	"github.com/pgdedup/pgdedup/internal/shape/plain"
)

// DB is what a [Store] calls on Postgres, and nothing more. A
// *pgxpool.Pool satisfies it and is what services should pass; a *pgx.Conn
// does too, but then the [Store] must not be used from several goroutines at
// once, like the Conn itself.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Store records processed message IDs for one consumer. It is safe for
// concurrent use when its [DB] is (a *pgxpool.Pool is).
type Store struct {
	db       DB
	cfg      Config
	log      *slog.Logger
	messages messageStatements
	offsets  offsetStatements
	// partitionMeta is the quoted pgdedup_partitions beside the table.
	partitionMeta string
	// partitionFunc is the quoted claim function of a partitioned table on
	// Citus.
	partitionFunc string
	found         atomic.Pointer[layouts] // looked up on first use (see Store.layouts)

	waits partitioned.Waits     // the partitioned cleanup's waits, which tests set
	move  partitioned.MoveTimes // the online move's times, which tests set

	turn plain.TurnWatch // Cleanup runs that found the cleaners' turn taken
}

// New returns a [Store] that records IDs for cfg.Consumer in db. It checks cfg
// as [Config.Validate] does and fills in the defaults; it does not touch the
// database (run [Migrate] first).
func New(db DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("pgdedup: db must not be nil")
	}
	table, offsetTable, err := cfg.tables()
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults(table)
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Store{db: db, cfg: cfg, log: logger,
		messages:      newMessageStatements(table, cfg.Retention, cfg.LockTimeout),
		offsets:       newOffsetStatements(offsetTable),
		partitionMeta: partitionMeta(table),
		partitionFunc: partitionFunc(table),
	}, nil
}

// Consumer returns the consumer name the [Store] records IDs under.
func (s *Store) Consumer() string { return s.cfg.Consumer }

// Table returns the quoted, possibly schema-qualified name of the dedup table.
func (s *Store) Table() string { return s.messages.table }

// Retention returns how long the store remembers an ID: Config.Retention, or
// its default.
func (s *Store) Retention() time.Duration { return s.cfg.Retention }

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
// Failures of pgdedup's own transaction are retried up to
// [Config.MaxAttempts], with jittered backoff: the connection lost under the
// claim, under fn or during COMMIT, and the transaction aborted by a
// serialization failure or deadlock (see [IsTransient]). An error fn returns
// is retried only when the transaction fn was given failed: its connection is
// closed, or the server aborted it with a serialization failure or deadlock.
// Any other error fn returns comes back after one attempt, whatever its type
// or SQLSTATE, and is not transient: a second database connection's error
// (its COMMIT may have landed), an HTTP client's error, a decoder's io.EOF.
// pgdedup cannot know whether what fn called acted on the request. A
// serialization failure that fn caught in a savepoint and then returned
// leaves the transaction usable, so it is not retried either. After a connection lost during
// COMMIT the outcome is unknown; the retry finds the ID if that commit landed
// and then reports a duplicate, so processed may be false for a message whose
// effects this call committed.
//
// opts are per-call options: [WithFingerprint] (a reused ID with another
// payload returns [ErrPayloadMismatch]), [WithRetention] and [WithSentAt] (a
// message too old to dedup returns [ErrTooLate]). Without them Process sends
// the same statements as it always did.
func (s *Store) Process(ctx context.Context, messageID string, fn func(ctx context.Context, tx pgx.Tx) error, opts ...Option) (processed bool, err error) {
	c, err := s.newIDClaim(messageID, opts)
	if err != nil {
		return false, err
	}
	if fn == nil {
		return false, errNilFunc
	}
	return s.process(ctx, c, fn)
}

// newIDClaim validates messageID and opts and prepares their claim.
func (s *Store) newIDClaim(messageID string, opts []Option) (*idClaim, error) {
	if err := ValidateMessageID(messageID); err != nil {
		return nil, err
	}
	o, err := s.cfg.callOptions(opts)
	if err != nil {
		return nil, err
	}
	return &idClaim{store: s, id: messageID, opts: o}, nil
}

// ProcessBatch is [Store.Process] for many messages at once: one transaction claims all
// of messageIDs (one statement, whatever the count) and runs fn once with the
// IDs that are new, in the order they first appear in messageIDs. When none is
// new, fn is not called and fresh is empty. fn must handle exactly the fresh
// messages: their IDs are recorded when the transaction commits.
//
// Errors, panics and retries behave as in Process. If any ID is invalid, the
// whole batch is rejected with [ErrInvalidMessageID], naming its index, and a
// batch of more than [Config.MaxBatch] IDs with [ErrBatchTooLarge], before
// anything is sent.
func (s *Store) ProcessBatch(ctx context.Context, messageIDs []string, fn func(ctx context.Context, tx pgx.Tx, fresh []string) error) (fresh []string, err error) {
	c, err := s.newBatchClaim(messageIDs)
	if err != nil || len(c.sorted.ids) == 0 {
		return nil, err
	}
	if fn == nil {
		return nil, errNilFunc
	}
	committed, err := s.process(ctx, c, func(ctx context.Context, tx pgx.Tx) error { return fn(ctx, tx, c.freshIDs()) })
	if !committed {
		return nil, err
	}
	return c.freshIDs(), err
}
