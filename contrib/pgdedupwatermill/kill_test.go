package pgdedupwatermill_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/plugin"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/contrib/pgdedupwatermill"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

const childEnv = "PGDEDUPWATERMILL_CONSUMER"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		if err := consume(); err != nil {
			fmt.Println("consumer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// consume is a consumer process of TestKilledConsumersChargeEachOrderOnce. It
// is a Watermill router on watermill-amqp whose handler charges an order in the
// pgdedup transaction and fails after its INSERT on FAIL_PERCENT of the
// deliveries. It prints one line per delivery with its outcome and runs until
// SIGINT (or SIGKILL).
func consume() error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DB_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "charges"})
	if err != nil {
		return err
	}
	dedup, err := pgdedupwatermill.New(store, pgdedupwatermill.Config{MetadataKey: "order_id"})
	if err != nil {
		return err
	}
	failPercent, _ := strconv.Atoi(os.Getenv("FAIL_PERCENT"))
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	router.AddPlugin(plugin.SignalsHandler)
	router.AddMiddleware(logOutcome, dedup.Middleware)
	router.AddConsumerHandler("charge", os.Getenv("TOPIC"), subscriberFor(os.Getenv("AMQP_URL")), func(msg *message.Message) error {
		msg.Metadata.Set("test-ran", "1")
		tx := pgdedupwatermill.Tx(msg.Context())
		if _, err := tx.Exec(msg.Context(), `INSERT INTO charges (order_id) VALUES ($1)`, msg.Metadata.Get("order_id")); err != nil {
			return err
		}
		if _, err := tx.Exec(msg.Context(), `SELECT pg_sleep(0.002)`); err != nil { // a little work, where kills land
			return err
		}
		if rand.IntN(100) < failPercent {
			return errors.New("payment provider timed out") // after the INSERT, so rolled back and nacked
		}
		return nil
	})
	return router.Run(ctx)
}

// logOutcome prints each delivery's outcome once the deduplicating
// middleware and the handler are done, before the router acks or nacks.
func logOutcome(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		msg.Metadata.Set("test-ran", "")
		out, err := h(msg)
		switch {
		case err != nil:
			fmt.Println("delivery outcome=failed")
		case msg.Metadata.Get("test-ran") == "1":
			fmt.Println("delivery outcome=processed")
		default:
			fmt.Println("delivery outcome=duplicate")
		}
		return out, err
	}
}

func subscriberFor(url string) message.Subscriber { return subscriber(nil, url) }

// TestKilledConsumersChargeEachOrderOnce publishes orders to a RabbitMQ queue
// through watermill-amqp, a tenth of them twice as a producer's retry would
// (a new message UUID, the same order_id metadata), consumes them with three
// consumer processes whose handler fails a tenth of its deliveries after its
// INSERT, SIGKILLs consumers mid-run and starts replacements. Once the queue
// has drained, every order is charged exactly once and none is dropped.
func TestKilledConsumersChargeEachOrderOnce(t *testing.T) {
	const (
		orders    = 600
		consumers = 3
		kills     = 5
	)
	url := amqpURL(t)
	db := pgdeduptest.New(t)
	pgdeduptest.Exec(t, db.Pool, `CREATE TABLE charges (id bigserial PRIMARY KEY, order_id text NOT NULL)`)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	topic, waiting := newTopic(t, url)

	msgs := orderMessages(orders)
	dups := 0
	for i := 0; i < orders; i += 10 {
		retry := message.NewMessage(watermill.NewUUID(), msgs[i].Payload)
		retry.Metadata.Set("order_id", msgs[i].Metadata.Get("order_id"))
		msgs = append(msgs, retry)
		dups++
	}
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	publish(t, url, topic, msgs)

	env := []string{"DB_URL=" + db.URL, "AMQP_URL=" + url, "TOPIC=" + topic, "FAIL_PERCENT=10"}
	var all, running []*proc
	for range consumers {
		p := startConsumer(t, env...)
		all, running = append(all, p), append(running, p)
	}
	charged := func() int { return pgdeduptest.Count(t, db.Pool, `SELECT count(*) FROM charges`) }
	for k := range kills {
		// Kill at evenly spaced points of progress, while handlers run.
		waitFor(t, ctx, "progress", func() bool { return charged() >= orders*(k+1)/(kills+2) })
		i := rand.IntN(len(running))
		running[i].kill()
		p := startConsumer(t, env...)
		all, running[i] = append(all, p), p
	}
	waitFor(t, ctx, "every order charged", func() bool { return charged() >= orders })
	for _, p := range running {
		p.stop(t)
	}
	// A last consumer drains what the others left, duplicates and nacked ones.
	last := startConsumer(t, env...)
	all = append(all, last)
	waitFor(t, ctx, "the queue to drain", func() bool { return waiting() == 0 })
	last.stop(t)

	c := sum(all)
	t.Logf("%d orders + %d duplicates published; %d consumer processes, %d SIGKILLed; deliveries: %d processed, %d duplicate, %d failed (nacked)",
		orders, dups, len(all), kills, c["processed"], c["duplicate"], c["failed"])
	if n := waiting(); n != 0 {
		t.Errorf("%d messages left in the queue", n)
	}
	rows := pgdeduptest.Count(t, db.Pool, `SELECT count(*) FROM charges`)
	distinct := pgdeduptest.Count(t, db.Pool, `SELECT count(DISTINCT order_id) FROM charges`)
	ids := pgdeduptest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'charges'`)
	if rows != orders || distinct != orders || ids != orders {
		t.Fatalf("%d charges for %d distinct orders, %d IDs recorded; want %d of each", rows, distinct, ids, orders)
	}
	if c["failed"] == 0 || c["duplicate"] < 1 {
		t.Errorf("the run exercised no failure or no duplicate: %v", c)
	}
}
