// Package pgdedup gives services on PostgreSQL exactly-once effects from
// at-least-once message delivery.
//
// A message's ID is inserted into processed_messages, unique on
// (consumer, message_id), in the same transaction as the business write. A
// duplicate finds the row and is skipped; a crash before COMMIT records nothing,
// so the redelivered message is processed again; [Store.Cleanup] deletes rows once the
// redelivery window has passed.
//
//	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
//	...
//	processed, err := store.Process(ctx, msg.ID, func(ctx context.Context, tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, "INSERT INTO charges (order_id, amount) VALUES ($1, $2)", o.ID, o.Amount)
//		return err
//	})
//	// err == nil: ack the message, whether processed is true or it was a duplicate.
//
// For a partitioned log read in order, such as Kafka, [Store.ProcessOffsets]
// keeps one row per (consumer, topic, partition) instead, holding the last
// processed offset, advanced in the business transaction; on assignment,
// [Store.ResumeOffsets] says where to resume.
package pgdedup
