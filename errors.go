package pgdedup

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/pgdedup/pgdedup/internal/engine"
	"github.com/pgdedup/pgdedup/internal/shape"
)

// The errors pgdedup returns, wrapped with what was being done. Compare with
// errors.Is. [ActionFor] says whether to ack, requeue, stop or dead-letter
// the message for each one.
var (
	// ErrInvalidMessageID is returned, wrapped with the reason, for an ID that is
	// empty, only whitespace, not valid UTF-8, contains a NUL byte or is longer
	// than [MaxMessageIDLen] bytes, and for a batch holding one (naming its index).
	// Nothing is sent to the database.
	ErrInvalidMessageID = errors.New("pgdedup: invalid message ID")

	// ErrBatchTooLarge is returned, wrapped with the sizes, for a batch of more
	// IDs than [Config.MaxBatch]. Nothing is sent to the database. Split the
	// batch.
	ErrBatchTooLarge = errors.New("pgdedup: batch too large")

	// ErrInFlight is returned when [Config.LockTimeout] is set and another
	// transaction still holds the same message ID (or partition) after that
	// long. This call did not process the message. Nack or requeue it so that
	// it is retried.
	ErrInFlight = engine.ErrInFlight

	// ErrInvalidOffset is returned, wrapped with the reason, for a
	// [TopicPartition] or offsets that cannot be claimed. Examples are an
	// empty or invalid topic, a negative partition, generation or offset, and
	// offsets that are not strictly increasing. Nothing is sent to the
	// database.
	ErrInvalidOffset = errors.New("pgdedup: invalid offset")

	// ErrFenced is returned when a claim's [TopicPartition.Generation] is
	// older than the one stored for the partition. Another consumer was
	// assigned the partition in a later generation and has committed since.
	// Nothing was claimed. Roll back, stop processing the partition and wait
	// for the next assignment and its offsets from [Store.ResumeOffsets].
	ErrFenced = engine.ErrFenced

	// ErrCleanupStarved is returned by [Store.Cleanup], wrapped with who holds
	// the turn, when it could not take the cleaners' turn and nobody was
	// cleaning. That lasted [Config.CleanupTurnWait], or three runs in a row.
	// Expired rows are piling up, so find the session that holds the turn. On
	// a [LayoutPartitioned] table it names the transactions that have kept
	// partitions from being sealed for a partition span (docs/partitioning.md).
	ErrCleanupStarved = shape.ErrCleanupStarved

	// ErrPayloadMismatch is matched (errors.Is) by the *[PayloadMismatchError]
	// that a call with [WithFingerprint] returns for a duplicate whose stored
	// fingerprint differs. The ID was reused with another payload, by a
	// producer's bug or an attack. Nothing was processed. Dead-letter the
	// message.
	ErrPayloadMismatch = engine.ErrPayloadMismatch

	// ErrResultTooLarge is returned, wrapped with the sizes, when the fn of
	// [Store.ProcessResult] returns a result longer than
	// [Config.MaxResultBytes] or [WithMaxResultBytes]. The transaction was
	// rolled back, so neither what fn wrote nor the ID is recorded.
	ErrResultTooLarge = errors.New("pgdedup: result too large to store")

	// ErrResultExpired is no longer returned. [Store.ProcessResult] returned
	// it for a duplicate whose row was past its expires_at but not yet
	// deleted by Cleanup. Such a row is now a duplicate like any other, with
	// its stored result, until it is deleted.
	//
	// Deprecated: ProcessResult returns the stored result of an expired row
	// that is not deleted yet. The variable remains so that code comparing
	// with it compiles.
	ErrResultExpired = errors.New("pgdedup: the stored result has expired")

	// ErrTooLate is returned, wrapped with the message's age, by a call with
	// [WithSentAt] for a message older than the Retention in force minus
	// [Config.LateMargin]. The table may have forgotten an earlier delivery,
	// so processing it could run it twice. Nothing is sent to the database.
	// Dead-letter it, or call again without WithSentAt to process it anyway.
	ErrTooLate = errors.New("pgdedup: message is older than the dedup table remembers")

	// ErrInvalidOption is returned, wrapped with the reason, for an [Option]
	// that cannot apply. Examples are an empty fingerprint, a retention below
	// [MinRetention], or [WithMaxResultBytes] given to a call that stores no
	// result. Nothing is sent to the database.
	ErrInvalidOption = errors.New("pgdedup: invalid option")

	errNilFunc = errors.New("pgdedup: fn must not be nil")
)

// ConfigError is the error [New] and [Config.Validate] return for an invalid
// [Config] field.
type ConfigError struct {
	Field  string // the field's name, such as "Retention"
	Reason string // what is wrong, worded to follow the name, such as "must not be negative, got -1s"
}

// Error returns the field's name followed by the reason.
func (e *ConfigError) Error() string { return "pgdedup: Config." + e.Field + " " + e.Reason }

// withDetail returns err with the DETAIL and HINT of the *pgconn.PgError it
// wraps, if any, added to its message. Other errors are returned as they are.
func withDetail(err error) error { return shape.WithDetail(err) }

// PayloadMismatchError is the error of a call with [WithFingerprint] whose
// message ID is recorded with a different fingerprint. The ID was reused for
// another payload. errors.Is(err, [ErrPayloadMismatch]) reports it.
//
// Stored and Given are there for programs that compare them. Do not log or
// trace them. An unkeyed hash of a guessable payload, such as a PIN or an
// amount, gives the payload away to whoever tries every candidate. Key the
// fingerprints ([WithFingerprint]) where payloads are guessable.
type PayloadMismatchError struct {
	MessageID string
	Stored    []byte // the fingerprint recorded with the ID, by its first delivery
	Given     []byte // the fingerprint of this delivery
}

// Error names the ID, and neither fingerprint, so that logs and traces of the
// error never carry a digest of a payload.
func (e *PayloadMismatchError) Error() string {
	return fmt.Sprintf("%s: %s: recorded with another fingerprint", ErrPayloadMismatch, strconv.Quote(e.MessageID))
}

// Is reports whether target is [ErrPayloadMismatch].
func (e *PayloadMismatchError) Is(target error) bool { return target == ErrPayloadMismatch }
