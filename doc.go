// Package pgdedup gives services on PostgreSQL exactly-once effects from
// at-least-once message delivery.
//
// A message's ID is inserted into processed_messages, unique on
// (consumer, message_id), in the same transaction as the business write. A
// duplicate finds the row and is skipped. A crash before COMMIT records
// nothing, so the redelivered message is processed again. [Store.Cleanup]
// deletes rows once the redelivery window has passed.
//
//	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
//	...
//	processed, err := store.Process(ctx, msg.ID, func(ctx context.Context, tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, "INSERT INTO charges (order_id, amount) VALUES ($1, $2)", o.ID, o.Amount)
//		return err
//	})
//	// A nil err means ack the message, whether processed is true or it was a duplicate.
//
// For a partitioned log read in order, such as Kafka, [Store.ProcessOffsets]
// keeps one row per (consumer, topic, partition) instead, holding the last
// processed offset, advanced in the business transaction. On assignment,
// [Store.ResumeOffsets] says where to resume.
//
// # The calls
//
// Each call claims one kind of thing in one kind of transaction.
//
//	                 own transaction        caller's pgx.Tx       caller's *sql.Tx
//	one ID           Process                Claim                 ClaimSQL
//	one ID, answer   ProcessResult          -                     -
//	IDs              ProcessBatch           ClaimBatch            ClaimBatchSQL
//	offsets          ProcessOffsets         ClaimOffsets          ClaimOffsetsSQL
//	one offset       ProcessOffset          ClaimOffset           -
//
// The Process calls begin the transaction, run fn in it, commit and retry.
// The Claim calls run in the caller's transaction and never retry. The calls
// ending in SQL take a database/sql transaction and run the same statements.
//
// Three cells are empty on purpose. A stored answer is what fn returns
// before COMMIT, and only the Process calls run fn. In the caller's
// transaction, write the answer to a table of your own in that transaction.
// ProcessOffset and ClaimOffset are shorthands for one offset. In
// database/sql, pass one offset to [Store.ClaimOffsetsSQL].
//
// Only the calls for one ID take an [Option]. A fingerprint and a send time
// belong to one message, so the batch and offset calls take none.
// [WithMaxResultBytes] limits a stored answer, so only [Store.ProcessResult]
// takes it. The other calls refuse it with [ErrInvalidOption] before anything
// is sent.
package pgdedup
