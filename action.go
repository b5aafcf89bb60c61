package pgdedup

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgdedup/pgdedup/internal/engine"
	"github.com/pgdedup/pgdedup/internal/shape"
)

// Action is what a consumer does with a message after a call of
// [Store.Process] or one of its kin. [ActionFor] returns it for the call's
// error. docs/errors.md lists every error pgdedup returns with its Action.
type Action int

const (
	// ActionAck means the message is done, so acknowledge it. Its effect
	// committed now or in an earlier delivery (a duplicate is not an error).
	ActionAck Action = iota
	// ActionRequeue means a later attempt can succeed. Nack the message so
	// that the broker redelivers it, after a delay where the broker has one.
	// Nothing was recorded.
	ActionRequeue
	// ActionStop means the consumer is shutting down or no longer owns the
	// message's partition. Neither acknowledge nor dead-letter it, and stop
	// taking messages. The broker redelivers it to whoever consumes next.
	// Nothing was recorded.
	ActionStop
	// ActionDeadLetter means no attempt can ever succeed. Send the message to
	// the dead-letter queue, or reject it without requeueing. Nothing was
	// recorded.
	ActionDeadLetter
)

// String returns "ack", "requeue", "stop" or "dead-letter".
func (a Action) String() string {
	switch a {
	case ActionAck:
		return "ack"
	case ActionRequeue:
		return "requeue"
	case ActionStop:
		return "stop"
	case ActionDeadLetter:
		return "dead-letter"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// ActionFor answers "ack, requeue, stop or dead-letter?" for err, the error
// of [Store.Process], [Store.ProcessBatch], [Store.ProcessOffsets],
// [Store.ProcessResult] or a claim, wrapped or not. A duplicate is not an
// error, so nil is [ActionAck].
//
// The answers are these.
//
//   - [ActionAck] for nil and for [ErrResultExpired]. An earlier delivery
//     processed the message.
//   - [ActionStop] for a canceled context (a shutdown) and for [ErrFenced]
//     (a newer consumer owns the partition).
//   - [ActionRequeue] for what a later attempt can cure. That is every error
//     that [IsTransient] calls transient, [ErrInFlight], [ErrCleanupStarved],
//     a context deadline, and the database conditions that docs/errors.md
//     lists. These are a lock or statement timeout, too many connections or
//     another lack of resources, and a claim that finds no partition because
//     the cleaner is late, whichever connection they come from.
//   - [ActionDeadLetter] for everything else. That is invalid input (such as
//     [ErrInvalidMessageID], [ErrPayloadMismatch], [ErrTooLate]), an invalid
//     [Config], and fn's own errors, which pgdedup cannot know to be curable.
//     fn can return an error a retry cures when it wraps one of the
//     conditions above.
//
// It classifies by error type and SQLSTATE, never by message text.
func ActionFor(err error) Action {
	switch {
	case err == nil, errors.Is(err, ErrResultExpired):
		return ActionAck
	case errors.Is(err, context.Canceled), errors.Is(err, ErrFenced):
		return ActionStop
	case IsTransient(err), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, ErrInFlight), errors.Is(err, ErrCleanupStarved),
		errors.As(err, new(*curableError)), engine.RetryableSQLState(err):
		return ActionRequeue
	}
	return ActionDeadLetter
}

// curableError marks an error of pgdedup's own claim that a later attempt
// cures once something outside the message changes. The table has no
// partition for the claim's time until a cleaner creates it. [ActionFor]
// answers [ActionRequeue] for it.
type curableError = shape.CurableError
