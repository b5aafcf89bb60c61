package pgdedupwatermill_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/contrib/pgdedupwatermill"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

func newDedup(t *testing.T, cfg pgdedupwatermill.Config) (*pgdeduptest.DB, *pgdedupwatermill.Deduplicator) {
	t.Helper()
	db := pgdeduptest.New(t)
	pgdeduptest.Exec(t, db.Pool, `CREATE TABLE charges (id bigserial PRIMARY KEY, order_id text NOT NULL)`)
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "charges"})
	if err != nil {
		t.Fatal(err)
	}
	d, err := pgdedupwatermill.New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return db, d
}

// charge is a handler writing in the middleware's transaction. It counts its
// runs and fails while fail is set.
func charge(runs *int, fail *error) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		*runs++
		tx := pgdedupwatermill.Tx(msg.Context())
		if _, err := tx.Exec(msg.Context(), `INSERT INTO charges (order_id) VALUES ($1)`, msg.UUID); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage("receipt-"+msg.UUID, nil)}, *fail
	}
}

func TestNewRefusesNilStore(t *testing.T) {
	if _, err := pgdedupwatermill.New(nil, pgdedupwatermill.Config{}); err == nil {
		t.Fatal("New(nil) returned no error")
	}
}

// A failure rolls back and records nothing, the redelivery runs the handler
// and commits, a duplicate runs nothing and produces no message.
func TestFailureThenRedeliveryThenDuplicate(t *testing.T) {
	t.Parallel()
	db, d := newDedup(t, pgdedupwatermill.Config{})
	var runs int
	fail := errors.New("provider down")
	h := d.Middleware(charge(&runs, &fail))
	msg := message.NewMessage("order-1", nil)
	ctx := msg.Context()

	if out, err := h(msg); !errors.Is(err, fail) || out != nil {
		t.Fatalf("failing handler: %v, %v", out, err)
	}
	fail = nil
	if out, err := h(msg); err != nil || len(out) != 1 {
		t.Fatalf("redelivery: %v, %v; want the handler's receipt", out, err)
	}
	if out, err := h(msg); err != nil || out != nil {
		t.Fatalf("duplicate: %v, %v; want nothing", out, err)
	}
	if runs != 2 || pgdeduptest.Count(t, db.Pool, `SELECT count(*) FROM charges`) != 1 {
		t.Fatalf("%d runs, %d charges; want 2, 1", runs, pgdeduptest.Count(t, db.Pool, `SELECT count(*) FROM charges`))
	}
	if msg.Context() != ctx || pgdedupwatermill.Tx(msg.Context()) != nil {
		t.Fatal("the message's context still carries the transaction")
	}
}

func TestMetadataKey(t *testing.T) {
	t.Parallel()
	db, d := newDedup(t, pgdedupwatermill.Config{MetadataKey: "order_id"})
	var runs int
	var fail error
	h := d.Middleware(charge(&runs, &fail))
	for _, uuid := range []string{"m-1", "m-2"} { // a producer's retry, with a new UUID and the same order
		msg := message.NewMessage(uuid, nil)
		msg.Metadata.Set("order_id", "order-7")
		if _, err := h(msg); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h(message.NewMessage("m-3", nil)); !errors.Is(err, pgdedupwatermill.ErrNoKey) {
		t.Fatalf("no order_id: %v, want ErrNoKey", err)
	}
	if runs != 1 || pgdeduptest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages WHERE message_id = 'order-7'`) != 1 {
		t.Fatalf("%d runs; want 1, keyed by order-7", runs)
	}
}

func TestInvalidIDIsAnError(t *testing.T) {
	t.Parallel()
	_, d := newDedup(t, pgdedupwatermill.Config{})
	var runs int
	var fail error
	if _, err := d.Middleware(charge(&runs, &fail))(message.NewMessage("", nil)); !errors.Is(err, pgdedup.ErrInvalidMessageID) || runs != 0 {
		t.Fatalf("empty UUID: %v, %d runs", err, runs)
	}
	if pgdedupwatermill.Tx(context.Background()) != nil {
		t.Fatal("Tx outside the middleware is not nil")
	}
}

// Poison sends to the poison queue what can never succeed (no key, an
// invalid ID, the handler's own error), and leaves to redelivery what a
// retry cures, such as a statement timeout in the handler or an ID in flight.
func TestPoisonFollowsActionFor(t *testing.T) {
	t.Parallel()
	db := pgdeduptest.New(t)
	pgdeduptest.Exec(t, db.Pool, `CREATE TABLE charges (id bigserial PRIMARY KEY, order_id text NOT NULL)`)
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "charges", LockTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	d, err := pgdedupwatermill.New(store, pgdedupwatermill.Config{MetadataKey: "order_id"})
	if err != nil {
		t.Fatal(err)
	}
	pgdeduptest.HoldClaim(t, db.Pool, store, "order-held")
	declined := errors.New("card declined")
	handler := func(msg *message.Message) ([]*message.Message, error) {
		tx := pgdedupwatermill.Tx(msg.Context())
		switch msg.Metadata.Get("do") {
		case "decline":
			return nil, declined
		case "slow":
			_, err := tx.Exec(msg.Context(), `SET LOCAL statement_timeout = '100ms'; SELECT pg_sleep(60)`)
			return nil, err
		}
		_, err := tx.Exec(msg.Context(), `INSERT INTO charges (order_id) VALUES ($1)`, msg.Metadata.Get("order_id"))
		return nil, err
	}
	h := d.Middleware(handler)
	for _, c := range []struct {
		name, orderID, do string
		want              bool
	}{
		{"charged", "order-1", "", false},
		{"no key", "", "", true},
		{"invalid ID", "order\x00", "", true},
		{"the handler's own error", "order-2", "decline", true},
		{"a statement timeout", "order-3", "slow", false},
		{"in flight", "order-held", "", false},
	} {
		msg := message.NewMessage("uuid-"+c.name, nil)
		if c.orderID != "" {
			msg.Metadata.Set("order_id", c.orderID)
		}
		msg.Metadata.Set("do", c.do)
		_, err := h(msg)
		if got := pgdedupwatermill.Poison(err); got != c.want {
			t.Errorf("%s: Poison(%v) = %v, want %v", c.name, err, got, c.want)
		}
	}
	if n := pgdeduptest.Count(t, db.Pool, `SELECT count(*) FROM charges`); n != 1 {
		t.Errorf("%d charges, want 1 (order-1)", n)
	}
}

// Config.SentAt reaches the claim: a message whose event time is beyond the
// Retention (48 h) fails with ErrTooLate, one two hours ahead (past the
// default SentAtMargin) with ErrInvalidOption, and neither runs the handler
// nor records its ID; one sent now, and one with no time, are processed.
func TestSentAtReachesTheClaim(t *testing.T) {
	t.Parallel()
	db, d := newDedup(t, pgdedupwatermill.Config{SentAt: pgdedupwatermill.SentAtFromMetadata("event_time")})
	var runs int
	var fail error
	h := d.Middleware(charge(&runs, &fail))
	now := time.Now()
	for _, tc := range []struct {
		uuid, time string
		want       error
	}{
		{"fresh", now.Format(time.RFC3339Nano), nil},
		{"too-old", now.Add(-49 * time.Hour).Format(time.RFC3339Nano), pgdedup.ErrTooLate},
		{"future", now.Add(2 * time.Hour).Format(time.RFC3339Nano), pgdedup.ErrInvalidOption},
		{"no-time", "", nil},
		{"bad-time", "yesterday", nil},
	} {
		msg := message.NewMessage(tc.uuid, nil)
		if tc.time != "" {
			msg.Metadata.Set("event_time", tc.time)
		}
		_, err := h(msg)
		if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s: %v, want %v", tc.uuid, err, tc.want)
		}
		if tc.want != nil && !pgdedupwatermill.Poison(err) {
			t.Errorf("%s: Poison(%v) = false, want a poison message", tc.uuid, err)
		}
	}
	if runs != 3 || pgdeduptest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages`) != 3 {
		t.Fatalf("%d runs, %d IDs recorded; want 3 and 3", runs, pgdeduptest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages`))
	}
}
