package pgdedup

import (
	"context"
	"time"
)

// Setup makes the dedup table the shape [Config.Layout] asks for. With
// [LayoutPlain] it does nothing ([Migrate] makes the plain table). With
// [LayoutPartitioned] it replaces the empty plain table that Migrate made by a
// table partitioned by claim time (same name, same columns, same privileges,
// column grants, row-level security and policies, plus SELECT on
// pgdedup_partitions for every role that may insert; a trigger of the
// user's own is refused with an error naming it), records
// its partition span (Retention ÷ [Config.Partitions]) in pgdedup_partitions,
// and creates the partitions for the next spans, and one for the past
// Retention (for IDs imported with their times: see docs/partitioning.md). Run it once
// after Migrate,
// as the table's owner: it is idempotent, and on
// a table already partitioned it only creates missing partitions.
//
// A plain table that holds rows is moved online while consumers claim: it
// becomes the partition of all claim times before a switch time T, at least
// 10 minutes and one partition span ahead, logged ([Config.Logger]) and
// shown by [Store.Stats] as that partition's end. A claim waits for the move
// at most one lock attempt of 200 ms and the short transaction that follows. A row whose
// processed_at is at or after T (or before 2000), which only a raw INSERT
// or an import makes, is given the move's time first (its ID stays
// claimed). A lock not taken by 5 minutes before T leaves the table as it
// was, with an error.
// Stores look a plain table up again every minute and so follow the move;
// a process running an older pgdedup release claims exactly only until T,
// and must be stopped by then. [SetupMigration] runs Setup from goose.
//
// On a table Citus distributes, Setup replaces the empty table by a
// partitioned one distributed by the same column, in the same shard group
// (co-located with the business tables that were), and creates the function
// claims call there (pgdedup_partitioned_claim, in the table's schema): see
// docs/partitioning.md. A populated distributed table is refused: the move
// runs on plain PostgreSQL only.
//
// A role granted INSERT on the table later also needs SELECT on
// pgdedup_partitions, which every claim reads.
//
// Setup uses no object it did not create in the same transaction. An
// existing pgdedup_partitions, partition or claim function is used only if
// its owner is the table's owner, the role running Setup or a superuser
// (and pgdedup_partitions has no triggers, rules or row security, and a
// partition a valid unique index on key). Any other object under a name
// Setup creates makes it fail with an error naming the object and its owner.
//
// After Setup, [Store.Cleanup] (RunCleaner, `pgdedup cleanup`) keeps the
// partitions: it creates them ahead of need, seals them and drops those whose
// IDs have all expired. Run it at least every partition span.
func (s *Store) Setup(ctx context.Context) error {
	if s.cfg.Layout != LayoutPartitioned {
		return nil
	}
	l, err := s.setupShape(ctx)
	if err != nil {
		return err
	}
	span := s.cfg.Retention / time.Duration(s.cfg.Partitions)
	return l.Setup(ctx, span, func() { s.found.Store(nil) })
}
