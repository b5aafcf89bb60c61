package pgdedupwatermill_test

import (
	"context"
	"fmt"
	"log"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/contrib/pgdedupwatermill"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// A router whose handler charges each order in the message's transaction.
// The same message sent twice charges once. (Watermill's in-process
// gochannel Pub/Sub keeps the example short. The tests use RabbitMQ.)
func ExampleDeduplicator_Middleware() {
	pool, done := pgdeduptest.ForExample()
	defer done()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (order_id text NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "charges"})
	if err != nil {
		log.Fatal(err)
	}
	dedup, err := pgdedupwatermill.New(store, pgdedupwatermill.Config{MetadataKey: "order_id"})
	if err != nil {
		log.Fatal(err)
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(dedup.Middleware)
	router.AddConsumerHandler("charge", "orders", pubSub, func(msg *message.Message) error {
		tx := pgdedupwatermill.Tx(msg.Context())
		_, err := tx.Exec(msg.Context(), `INSERT INTO charges VALUES ($1)`, msg.Metadata.Get("order_id"))
		return err
	})
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	for _, uuid := range []string{watermill.NewUUID(), watermill.NewUUID()} { // a producer's retry
		msg := message.NewMessage(uuid, []byte(`{"amount_cents":500}`))
		msg.Metadata.Set("order_id", "order-1")
		if err := pubSub.Publish("orders", msg); err != nil { // returns once the handler acked
			log.Fatal(err)
		}
	}
	_ = router.Close()
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&n)
	fmt.Println("charges:", n)
	// Output: charges: 1
}
