package pgdedup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/engine"
	"github.com/pgdedup/pgdedup/internal/shape/partitioned"
	"github.com/pgdedup/pgdedup/internal/shape/plain"
)

// DB is what a [Store] calls on Postgres, and nothing more. Services should
// pass a *pgxpool.Pool. A *pgx.Conn works too, but then the [Store] must not
// be used from several goroutines at once, like the Conn itself.
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
	offsets  engine.OffsetSQL
	// partitionMeta is the quoted pgdedup_partitions beside the table.
	partitionMeta string
	// partitionFunc is the quoted claim function of a partitioned table on
	// Citus.
	partitionFunc string
	found         atomic.Pointer[layouts] // looked up on first use (see Store.layouts)
	eng           *engine.Engine          // sends every claim

	waits partitioned.Waits     // the partitioned cleanup's waits, which tests set
	move  partitioned.MoveTimes // the online move's times, which tests set

	turn plain.TurnWatch // Cleanup runs that found the cleaners' turn taken
	// clock is the clock that bounds partitioned claims (time.Now when
	// nil), which tests set.
	clock func() time.Time
}

// New returns a [Store] that records IDs for cfg.Consumer in db. It checks cfg
// as [Config.Validate] does and fills in the defaults. It does not touch the
// database, so run [Migrate] first.
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
	s := &Store{db: db, cfg: cfg, log: logger,
		messages:      newMessageStatements(table, cfg.Retention, cfg.LockTimeout),
		offsets:       engine.NewOffsetSQL(offsetTable.Sanitize()),
		partitionMeta: partitionMeta(table),
		partitionFunc: partitionFunc(table),
	}
	s.eng = newEngine(s)
	return s, nil
}

// Consumer returns the consumer name the [Store] records IDs under.
func (s *Store) Consumer() string { return s.cfg.Consumer }

// Table returns the quoted, possibly schema-qualified name of the dedup table.
func (s *Store) Table() string { return s.messages.table }

// Retention returns how long the store remembers an ID. That is
// [Config.Retention], or its default.
func (s *Store) Retention() time.Duration { return s.cfg.Retention }

// Process runs fn exactly once per messageID for the [Store]'s consumer, in one
// transaction with the claim of the ID, and reports whether it ran.
//
// BEGIN and the claim go to Postgres in one round trip. If the ID is new, fn
// runs in the transaction, which then commits. The business write and the ID
// are recorded together or not at all. A duplicate returns (false, nil)
// without calling fn. Either way a nil error means the message is done, so
// ack it.
//
// If fn returns an error, the transaction rolls back, the ID is not recorded
// and the error is returned as is, so errors.Is works. If fn panics, the
// transaction rolls back and the panic continues. fn must not commit or roll
// back tx itself (use tx.Begin for a savepoint). Keep fn's side effects inside
// tx, because fn may run again after a rolled-back attempt.
//
// Failures of pgdedup's own transaction are retried up to
// [Config.MaxAttempts] times, with jittered backoff. These are a connection
// lost under the claim, under fn or during COMMIT, and a serialization
// failure or deadlock (see [IsTransient]). An error fn returns is retried only
// when the transaction fn was given failed, because its connection closed or
// the server aborted it with a serialization failure or deadlock. Any other
// error from fn comes back after one attempt and is not transient, whatever
// its type or SQLSTATE. pgdedup cannot know whether what fn called, such as a
// second database or an HTTP service, acted on the request. A serialization
// failure that fn caught in a savepoint leaves the transaction usable, so it
// is not retried either. After a connection lost during COMMIT the outcome is
// unknown. The retry then finds the ID if that commit landed and reports a
// duplicate, so processed may be false for a message whose effects this call
// committed.
//
// opts are per-call options (see [Option]). [WithFingerprint] turns a reused
// ID with another payload into [ErrPayloadMismatch]. [WithRetention] changes
// how long the ID is kept. [WithSentAt] refuses a message too old to dedup
// with [ErrTooLate]. Without options Process sends the same statements as
// before options existed.
func (s *Store) Process(ctx context.Context, messageID string, fn func(ctx context.Context, tx pgx.Tx) error, opts ...Option) (processed bool, err error) {
	c, _, err := s.newIDClaim("Process", messageID, opts)
	if err != nil {
		return false, err
	}
	if fn == nil {
		return false, errNilFunc
	}
	return s.eng.Process(ctx, c, fn)
}

// ProcessBatch is [Store.Process] for many messages at once. One transaction
// claims all of messageIDs in one statement, whatever the count, and runs fn
// once with the IDs that are new. fresh keeps the order in which they first
// appear in messageIDs. When none is new, fn is not called and fresh is empty.
// fn must handle exactly the fresh messages, whose IDs are recorded when the
// transaction commits.
//
// Errors, panics and retries behave as in Process. If any ID is invalid, the
// whole batch is rejected with [ErrInvalidMessageID], naming its index. A
// batch of more than [Config.MaxBatch] IDs is rejected with
// [ErrBatchTooLarge]. Both happen before anything is sent.
//
// opts may hold [WithSentAt] with the earliest first-sent time of the
// batch's messages, which bounds the claim of every ID and is the batch's
// late-message guard; other options return [ErrInvalidOption].
func (s *Store) ProcessBatch(ctx context.Context, messageIDs []string, fn func(ctx context.Context, tx pgx.Tx, fresh []string) error, opts ...Option) (fresh []string, err error) {
	c, err := s.newBatchClaim("ProcessBatch", messageIDs, opts)
	if err != nil || len(c.Sorted) == 0 {
		return nil, err
	}
	if fn == nil {
		return nil, errNilFunc
	}
	committed, err := s.eng.Process(ctx, c, func(ctx context.Context, tx pgx.Tx) error { return fn(ctx, tx, c.FreshIDs()) })
	if !committed {
		return nil, err
	}
	return c.FreshIDs(), err
}

// ProcessResult is [Store.Process] for consumers that answer requests, such
// as RPC over a reply-to queue or NATS request/reply. fn returns the answer,
// which is stored with the claim of messageID in fn's transaction. A duplicate
// gets the first answer back instead of a new one.
//
// For a new ID, fn runs, its result is stored before COMMIT, and ProcessResult
// returns it with processed true. For a duplicate, fn is not called and the
// stored result is returned with processed false. The result is nil if the ID
// was recorded without one, by Process or by a Claim. An ID is a duplicate
// until [Store.Cleanup] or [Store.Forget] deletes its row. So a row past its
// expires_at that is not deleted yet still gives its stored result, and its
// fingerprint is still compared ([ErrPayloadMismatch]). While the first
// delivery is in flight, a duplicate waits for it, or returns [ErrInFlight]
// after [Config.LockTimeout].
//
// A result longer than [Config.MaxResultBytes] or [WithMaxResultBytes] fails
// the call with [ErrResultTooLarge] and rolls everything back. Errors, panics,
// retries and opts are as in Process. It needs migration 00006. A new ID
// costs one round trip more than Process (the result's UPDATE), and a
// duplicate costs the same.
func (s *Store) ProcessResult(ctx context.Context, messageID string, fn func(ctx context.Context, tx pgx.Tx) ([]byte, error), opts ...Option) (result []byte, processed bool, err error) {
	c, o, err := s.newIDClaim(callProcessResult, messageID, opts)
	if err != nil {
		return nil, false, err
	}
	if fn == nil {
		return nil, false, errNilFunc
	}
	limit, limitName := s.cfg.MaxResultBytes, "Config.MaxResultBytes"
	if o.maxResultSet {
		limit, limitName = o.maxResult, "WithMaxResultBytes"
	}
	store := func(ctx context.Context, tx pgx.Tx) error {
		res, err := fn(ctx, tx)
		if err != nil {
			return err
		}
		if len(res) > limit {
			return fmt.Errorf("%w: %s: %d bytes, more than %s (%d)", ErrResultTooLarge, c.Subject(), len(res), limitName, limit)
		}
		if res != nil { // NULL already
			if err := s.eng.StoreResult(ctx, tx, c, res); err != nil {
				return err
			}
		}
		result = res
		return nil
	}
	// Cleanup or Forget can delete a duplicate's row between the claim and
	// the read of its result. Then the ID is claimed again, as the new ID it
	// has become.
	for range 3 {
		processed, err = s.eng.Process(ctx, c, store)
		if err != nil || processed || c.Found {
			break
		}
	}
	switch {
	case err != nil:
		return nil, false, err
	case processed:
		return result, true, nil
	}
	return c.Result, false, nil
}

// ProcessOffset runs fn for the record at offset of partition p unless p's
// stored offset is already at or above it. It advances the stored offset in
// the same transaction and reports whether fn ran. It is
// [Store.ProcessOffsets] for one record, and the consumer's rules are there.
func (s *Store) ProcessOffset(ctx context.Context, p TopicPartition, offset int64, fn func(ctx context.Context, tx pgx.Tx) error) (processed bool, err error) {
	if fn == nil {
		return false, errNilFunc
	}
	fresh, err := s.ProcessOffsets(ctx, p, []int64{offset}, func(ctx context.Context, tx pgx.Tx, _ []int64) error {
		return fn(ctx, tx)
	})
	return len(fresh) == 1, err
}

// ProcessOffsets is the offset counterpart of [Store.ProcessBatch], for a
// partitioned log such as Kafka. One row per (consumer, topic, partition)
// holds the last processed offset, instead of one row per message. In one
// transaction it advances p's stored offset to the highest of offsets and runs
// fn once with the offsets above the previously stored one (fresh), in order.
// The effects and the offset commit together. When no offset is above it, fn
// is not called and fresh is empty, because the records were processed before
// (a redelivery after a rebalance or a crash). BEGIN and the claim go in one
// round trip, with one statement whatever the batch size.
//
// offsets must be strictly increasing. Gaps are allowed, since compaction and
// transaction markers leave them in Kafka. Errors, panics and retries behave
// as in [Store.Process]. A claim older than the stored generation returns
// [ErrFenced] (see [TopicPartition]).
//
// The database enforces that the stored offset only moves forward. So a
// record at or below it is never processed again, by this consumer or by a
// zombie that still holds a revoked partition. Concurrent claims of one
// partition take turns on its row. The consumer must keep the rest, because
// a skipped record cannot be told from a gap. Hand each partition's records
// over in offset order, one transaction at a time, starting from the offset
// that [Store.ResumeOffsets] returned on assignment, without skipping a
// fetched record. After an error, do not go on to the partition's later
// records. Retry, or seek back to the stored offset. To skip a poison record,
// commit its offset with an fn that records it elsewhere, such as a
// dead-letter table.
func (s *Store) ProcessOffsets(ctx context.Context, p TopicPartition, offsets []int64, fn func(ctx context.Context, tx pgx.Tx, fresh []int64) error) (fresh []int64, err error) {
	if err := validateOffsets(p, offsets); err != nil || len(offsets) == 0 {
		return nil, err
	}
	if fn == nil {
		return nil, errNilFunc
	}
	c := s.newOffsetsClaim(p, offsets)
	committed, err := s.eng.Process(ctx, c, func(ctx context.Context, tx pgx.Tx) error { return fn(ctx, tx, c.FreshOffsets()) })
	if !committed {
		return nil, err
	}
	return c.FreshOffsets(), err
}
