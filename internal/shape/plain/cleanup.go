package plain

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// Cleanup is Store.Cleanup on one PostgreSQL server. It deletes batches of
// rows picked in expires_at order, by ctid, and takes turns as cleanupSQL
// says.
func Cleanup(ctx context.Context, env shape.Env) (deleted int64, skipped bool, err error) {
	turnSQL, deleteSQL := cleanupSQL(env.Table)
	batch := env.CleanupBatchSize
	from := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	for first := true; ; first = false {
		if err := ctx.Err(); err != nil {
			return deleted, false, err
		}
		t0 := time.Now()
		turn, n, err := cleanupBatch(ctx, env.DB, turnSQL, deleteSQL, batch, &from)
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return deleted, false, ctxErr
			}
			return deleted, false, fmt.Errorf("pgdedup: cleanup of %s: %w", env.Table, shape.WithDetail(err))
		}
		deleted += n
		env.Log.DebugContext(ctx, "pgdedup: cleanup batch", "deleted", n, "turn", turn, "duration", time.Since(t0))
		// Without the turn, another cleaner holds it. It got the turn after
		// this one's last batch committed, so it sees everything this one
		// deleted, and it goes on until its own batch comes back short.
		// With the turn, a short batch means nothing expired is left from
		// *from on, as of a snapshot taken with the turn held.
		if !turn || n < batch {
			return deleted, first && !turn, nil
		}
	}
}

// cleanupBatch sends one batch's two statements (see cleanupSQL) in one
// round trip and one implicit transaction. It reports whether this cleaner
// had the turn and how many rows it deleted. It moves *from to where the
// next batch starts.
func cleanupBatch(ctx context.Context, db shape.DB, turnSQL, deleteSQL string, batch int64, from *pgtype.Timestamptz) (turn bool, n int64, err error) {
	b := &pgx.Batch{}
	b.Queue(turnSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&turn) })
	b.Queue(deleteSQL, batch, *from).QueryRow(func(row pgx.Row) error { return row.Scan(&n, from) })
	return turn, n, db.SendBatch(ctx, b).Close()
}

// cleanupSQL returns the two statements of a batch. They go together as one
// pgx batch, so they cost one round trip and run in one implicit
// transaction. Nothing is left in the session. pgx's simple protocol sends
// them as one multi-statement query, to the same effect.
//
// The first takes this batch's turn. Concurrent cleaners take turns through
// a transaction-scoped advisory lock, keyed by the table's OID. Each batch
// tries it once and keeps it, with the answer, until its transaction ends.
// A batch that does not get it deletes nothing, and its Cleanup leaves the
// rest to the cleaner at work. So cleaners never wait for each other. The
// lock ends with each batch's transaction, which PgBouncer allows. Unlike
// FOR UPDATE SKIP LOCKED, it needs no UPDATE privilege. SELECT and DELETE
// are enough. Claims never wait on a cleaner, except for an expired ID
// redelivered while its row is being deleted. A cleaner never waits on a
// claim, because ON CONFLICT DO NOTHING locks nothing.
//
// The turn is taken in a statement of its own, before the DELETE. In READ
// COMMITTED each statement takes its snapshot when it starts. A DELETE that
// tried the lock itself would pick its rows from a snapshot older than its
// turn. It could miss the last batch committed by the cleaner before it,
// delete less than a batch, and end its run. That other cleaner, finding
// the turn taken, would end its own run too, and expired rows would be
// left. Here the DELETE's snapshot is taken with the turn held, so it sees
// every batch committed before.
//
// The second deletes the oldest expired rows from expires_at $2 on, if the
// turn was taken. That is a constant condition, so without the turn no
// index is read. It returns how many it deleted and the latest expires_at
// among them, where the next batch starts. So no batch walks again over the
// index entries of the rows deleted before it. Until vacuum removes them,
// which it cannot do while an older transaction is open, every scan from
// the start of the index would visit them all. A long Cleanup would slow
// down batch after batch. The rows are found through the expires_at index
// and deleted by ctid, a TID scan without a second index lookup. The DELETE
// checks expires_at again.
func cleanupSQL(t string) (turn, del string) {
	turn = `SELECT set_config('` + shape.CleanupTurnSetting + `', pg_try_advisory_xact_lock(` +
		shape.CleanupLockClass + `, '` + t + `'::regclass::oid::int4)::text, true)::boolean`
	del = `WITH deleted AS (
DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(
SELECT ctid FROM ` + t + ` WHERE current_setting('` + shape.CleanupTurnSetting + `', true) = 'true'
AND expires_at < now() AND expires_at >= $2
ORDER BY expires_at LIMIT $1))
AND expires_at < now()
RETURNING expires_at)
SELECT count(*), coalesce(max(expires_at), $2) FROM deleted`
	return turn, del
}

// Sizes fills in st's dead tuples, last vacuums and indexes from the
// statistics views and catalogs, which any role may read. The sizes were
// read before, alike for every shape.
func Sizes(ctx context.Context, env shape.Env, st *shape.Sizes) error {
	err := env.DB.QueryRow(ctx, `SELECT n_dead_tup, last_vacuum, last_autovacuum FROM pg_stat_user_tables
WHERE relid = to_regclass($1::text)`, env.Table).Scan(&st.DeadTuples, &st.LastVacuum, &st.LastAutovacuum)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) { // no row: track_counts is off
		return fmt.Errorf("pgdedup: stats of %s: read vacuum statistics: %w", env.Table, err)
	}
	for _, t := range []*time.Time{st.LastVacuum, st.LastAutovacuum} {
		if t != nil {
			*t = t.UTC()
		}
	}
	rows, _ := env.DB.Query(ctx, `SELECT c.relname, am.amname, pg_total_relation_size(c.oid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam
WHERE i.indrelid = to_regclass($1::text) ORDER BY c.relname`, env.Table)
	st.Indexes, err = pgx.CollectRows(rows, pgx.RowToStructByPos[shape.IndexSize])
	if err != nil {
		return fmt.Errorf("pgdedup: stats of %s: read index sizes: %w", env.Table, err)
	}
	return nil
}
