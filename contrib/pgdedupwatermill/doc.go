// Package pgdedupwatermill makes Watermill handlers run exactly once per
// message. [Deduplicator.Middleware] runs each handler inside
// [pgdedup.Store.Process], in one PostgreSQL transaction with the claim of the
// message's ID. The handler reaches that transaction through [Tx] on
// msg.Context().
//
//	dedup, err := pgdedupwatermill.New(store, pgdedupwatermill.Config{})
//	router.AddMiddleware(dedup.Middleware)
//	router.AddNoPublisherHandler("charge", "orders", sub, func(msg *message.Message) error {
//		tx := pgdedupwatermill.Tx(msg.Context())
//		_, err := tx.Exec(msg.Context(), `INSERT INTO charges ...`)
//		return err
//	})
//
// The router acks a message after its handler returns nil, which is after
// COMMIT, and nacks it when the handler returns an error, which rolled the
// transaction back and left the ID unclaimed, so the redelivery runs the
// handler again. A duplicate (the ID committed before) is acked without running
// the handler.
//
// It is the durable replacement for Watermill's middleware.Deduplicator, which
// keeps keys in the memory of one process and records a key before the
// handler runs. A message whose handler failed is dropped as a duplicate when
// it is redelivered, and another process or a restart sees none of the keys.
package pgdedupwatermill
