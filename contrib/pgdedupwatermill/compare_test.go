package pgdedupwatermill_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/contrib/pgdedupwatermill"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// TestDeduplicatorComparedOnFailures runs the same handler, whose first
// delivery of every fourth order fails (a payment provider's timeout), behind
// Watermill's middleware.Deduplicator and behind pgdedupwatermill, on
// watermill-amqp. Each gets every order once plus a redelivery of a few with
// the same UUID. The Deduplicator recorded each failed message's key before
// its handler ran, so the redelivery is taken for a duplicate, acked and
// dropped, so those orders are never charged. pgdedupwatermill recorded nothing
// for the failure (its transaction rolled back), so the redelivery charges.
func TestDeduplicatorComparedOnFailures(t *testing.T) {
	const orders = 40
	url := amqpURL(t)
	db := pgdeduptest.New(t)
	pgdeduptest.Exec(t, db.Pool, `CREATE TABLE charges (id bigserial PRIMARY KEY, via text NOT NULL, order_id text NOT NULL)`)
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "charges"})
	if err != nil {
		t.Fatal(err)
	}
	durable, err := pgdedupwatermill.New(store, pgdedupwatermill.Config{})
	if err != nil {
		t.Fatal(err)
	}
	inMemory := &middleware.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil }}

	run := func(via string, dedup message.HandlerMiddleware) (failed int) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		topic, waiting := newTopic(t, url)
		msgs := orderMessages(orders)
		for i := 0; i < orders; i += 8 { // the same message delivered twice
			msgs = append(msgs, message.NewMessage(msgs[i].UUID, msgs[i].Payload))
		}
		publish(t, url, topic, msgs)

		var mu sync.Mutex
		seen := map[string]bool{}
		var deliveries, failures atomic.Int32
		router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				defer deliveries.Add(1)
				return h(msg)
			}
		}, dedup)
		router.AddConsumerHandler(via, topic, subscriber(t, url), func(msg *message.Message) error {
			mu.Lock()
			first := !seen[msg.UUID]
			seen[msg.UUID] = true
			mu.Unlock()
			if first && orderIndex(msg.UUID)%4 == 0 {
				failures.Add(1)
				return errors.New("payment provider timed out")
			}
			tx := pgdedupwatermill.Tx(msg.Context())
			var exec func(context.Context, string, ...any) error
			if tx != nil {
				exec = func(ctx context.Context, sql string, args ...any) error {
					_, err := tx.Exec(ctx, sql, args...)
					return err
				}
			} else { // the Deduplicator gives no transaction, so a plain write
				exec = func(ctx context.Context, sql string, args ...any) error {
					_, err := db.Pool.Exec(ctx, sql, args...)
					return err
				}
			}
			return exec(msg.Context(), `INSERT INTO charges (via, order_id) VALUES ($1, $2)`, via, msg.UUID)
		})
		go func() { _ = router.Run(ctx) }()
		<-router.Running()
		waitFor(t, ctx, via+": every delivery settled", func() bool {
			return int(deliveries.Load()) >= len(msgs)+int(failures.Load()) && waiting() == 0
		})
		if err := router.Close(); err != nil {
			t.Fatal(err)
		}
		return int(failures.Load())
	}

	failedMem := run("watermill-deduplicator", inMemory.Middleware)
	failedDurable := run("pgdedupwatermill", durable.Middleware)
	byVia := pgdeduptest.CountBy(t, db.Pool, `SELECT via, count(DISTINCT order_id) FROM charges GROUP BY via`)
	rows := pgdeduptest.Count(t, db.Pool, `SELECT count(*) FROM charges`)
	t.Logf("%d orders, each handler failed %d first deliveries: middleware.Deduplicator charged %d (dropped %d), pgdedupwatermill charged %d",
		orders, failedMem, byVia["watermill-deduplicator"], orders-byVia["watermill-deduplicator"], byVia["pgdedupwatermill"])
	if failedMem != orders/4 || failedDurable != orders/4 {
		t.Fatalf("failed deliveries: %d, %d; want %d each", failedMem, failedDurable, orders/4)
	}
	if byVia["pgdedupwatermill"] != orders {
		t.Errorf("pgdedupwatermill charged %d orders, want all %d", byVia["pgdedupwatermill"], orders)
	}
	if byVia["watermill-deduplicator"] != orders-failedMem {
		t.Errorf("middleware.Deduplicator charged %d orders; expected it to drop the %d that failed once", byVia["watermill-deduplicator"], failedMem)
	}
	if rows != byVia["pgdedupwatermill"]+byVia["watermill-deduplicator"] {
		t.Errorf("%d charge rows: an order was charged twice", rows)
	}
}

func orderIndex(uuid string) int {
	var i int
	for _, c := range uuid[len("order-"):] {
		i = i*10 + int(c-'0')
	}
	return i
}
