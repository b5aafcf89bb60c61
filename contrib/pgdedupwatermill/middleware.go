package pgdedupwatermill

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
)

// ErrNoKey is returned, wrapped with the metadata key's name, for a message
// without the metadata field that [Config.MetadataKey] names (or with an empty
// one). The message is nacked. Route such messages to a poison queue
// (Watermill's middleware.PoisonQueueWithFilter with [Poison]) rather than
// redelivering them forever.
var ErrNoKey = errors.New("pgdedupwatermill: message has no ID in its metadata")

// Config configures a [Deduplicator].
type Config struct {
	// MetadataKey names the message metadata field whose value is the message's
	// ID, for producers that set a business ID (an order ID) there. Left empty,
	// the ID is the Watermill message UUID, which a redelivery keeps but a
	// producer's retry that builds a new message does not. Defaults to "".
	MetadataKey string

	// SentAt, if set, returns the time msg was first sent, which the
	// middleware passes to [pgdedup.WithSentAt]; the zero time passes none.
	// On the partitioned table the claim then looks only in the partitions
	// from that time less pgdedup.Config.SentAtMargin on, and a message older
	// than the Retention fails with [pgdedup.ErrTooLate] (a poison message) rather
	// than being processed after its ID may have been forgotten. Return a
	// time the producer sets once per ID, such as [SentAtFromMetadata] of an
	// event-time field; a broker's publish time is safe only if the
	// producer's retries of one ID fall within SentAtMargin. Watermill itself
	// sets no time on a message. Defaults to nil: no time.
	SentAt func(msg *message.Message) time.Time
}

// SentAtFromMetadata returns a [Config.SentAt] that reads the metadata field
// key as an RFC 3339 time, such as a CloudEvents time attribute the
// producer set. A missing or unparsable field gives the zero time: the claim
// then has no time, as without SentAt.
func SentAtFromMetadata(key string) func(*message.Message) time.Time {
	return func(msg *message.Message) time.Time {
		t, err := time.Parse(time.RFC3339Nano, msg.Metadata.Get(key))
		if err != nil {
			return time.Time{}
		}
		return t
	}
}

// Deduplicator runs Watermill handlers exactly once per message ID, in a
// transaction of its [pgdedup.Store]. It is safe for concurrent use.
type Deduplicator struct {
	store *pgdedup.Store
	cfg   Config
}

// New returns a Deduplicator recording message IDs with store, under the
// store's consumer name (one per handler, unless handlers must share IDs).
func New(store *pgdedup.Store, cfg Config) (*Deduplicator, error) {
	if store == nil {
		return nil, errors.New("pgdedupwatermill: New needs a *pgdedup.Store, got nil")
	}
	return &Deduplicator{store: store, cfg: cfg}, nil
}

// Key returns the ID msg is deduplicated by. That is its UUID, or the
// metadata field Config.MetadataKey names ([ErrNoKey] if that is missing).
func (d *Deduplicator) Key(msg *message.Message) (string, error) {
	if d.cfg.MetadataKey == "" {
		return msg.UUID, nil
	}
	if id := msg.Metadata.Get(d.cfg.MetadataKey); id != "" {
		return id, nil
	}
	return "", fmt.Errorf("%w: %q", ErrNoKey, d.cfg.MetadataKey)
}

// Middleware is a message.HandlerMiddleware. Add it to a router
// (router.AddMiddleware) or to one handler (handler.AddMiddleware).
//
// It runs h in a transaction that claims the message's ID, with msg's context
// carrying the transaction ([Tx]) while h runs. If h returns nil, the
// transaction commits and Middleware returns h's messages for the router to
// publish. If h returns an error (or panics), the transaction rolls back and
// the error is returned, so the router nacks the message and its redelivery
// runs h again. A message whose ID committed before returns no error and no
// messages, without running h, so the router acks it.
//
// Messages h returns are published by the router after COMMIT and are lost if
// the process dies in between, since the redelivery is then a duplicate.
// Publish what must not be lost from inside the transaction instead, through
// an outbox such as watermill-sql's publisher on the transaction or River's
// InsertTx.
//
// An invalid ID (see [pgdedup.ErrInvalidMessageID]) and a missing metadata
// key ([ErrNoKey]) are returned as errors, so the message is nacked. With
// pgdedup.Config.LockTimeout set, a message whose ID another transaction holds
// gets [pgdedup.ErrInFlight]. It is nacked and redelivered later.
func (d *Deduplicator) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		id, err := d.Key(msg)
		if err != nil {
			return nil, err
		}
		outer := msg.Context()
		defer msg.SetContext(outer)
		var opts []pgdedup.Option
		if d.cfg.SentAt != nil {
			if t := d.cfg.SentAt(msg); !t.IsZero() {
				opts = append(opts, pgdedup.WithSentAt(t))
			}
		}
		var produced []*message.Message
		_, err = d.store.Process(outer, id, func(ctx context.Context, tx pgx.Tx) error {
			msg.SetContext(context.WithValue(ctx, txKey{}, tx))
			var err error
			produced, err = h(msg)
			return err
		}, opts...)
		if err != nil {
			return nil, err
		}
		return produced, nil
	}
}

type txKey struct{}

// Poison reports whether err, returned by [Deduplicator.Middleware], is one
// no redelivery can cure, that is, one [pgdedup.ActionFor] answers
// [pgdedup.ActionDeadLetter] for. Such errors are [ErrNoKey], an invalid ID,
// and the handler's own errors unless they wrap a condition a retry cures.
// Pass it to Watermill's middleware.PoisonQueueWithFilter, added before the
// Deduplicator. A lost connection, [pgdedup.ErrInFlight], a timeout or a
// shutdown are then nacked and redelivered, and the rest go to the poison
// queue.
func Poison(err error) bool {
	return pgdedup.ActionFor(err) == pgdedup.ActionDeadLetter
}

// Tx returns the transaction [Deduplicator.Middleware] runs the handler in,
// from msg.Context(). Write the message's business rows in it, and they
// commit with the message's ID. Do not commit or roll it back, because the
// middleware does so after the handler returns (use tx.Begin for a
// savepoint). Outside the
// middleware Tx returns nil.
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}
