package pgdedup

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file is the one path every claim takes. A claim is a single ID, a
// batch of IDs or a partition's offsets. It runs in a transaction the
// Process calls begin, in the caller's pgx transaction, or in the caller's
// database/sql transaction. A kind of claim only says which statements to
// send and what their answer means (the claim interface). The table's layout
// says how they are written where the table lives (layout.go). Sending,
// reading, in-flight and duplicate handling, fn, COMMIT, retries, error
// wrapping, logs and events are written here once.

// claim is one kind of claim, for one call. It gives the statements that
// claim its items and, once they have run, its outcome.
type claim interface {
	// statements returns what to send on l, in order. Their callbacks record
	// the outcome in the claim, which starts afresh with each call.
	statements(l *layouts) claimStatements
	// outcome reads the result after the statements ran. It says how many
	// items were new, and how many were skipped as already claimed. An error here (a
	// fenced partition) fails the claim.
	outcome() (fresh, skipped int, err error)
	// subject names what is claimed, for error messages, such as `"order-1"`,
	// "batch of 3 IDs" or "orders partition 2 offsets 5-9".
	subject() string
	// messageID is the ID of a single-ID claim, for logs and events. It is
	// empty for batches and offsets.
	messageID() string
	// size is how many items the claim claims (distinct IDs, offsets).
	size() int
}

// claimStatements are the statements of one claim, sent in one round trip
// with pgx. They are the transaction-local settings it runs with, the claim
// itself, and the statements restoring the settings.
type claimStatements struct {
	settings txSettings
	claim    []statement
}

// txSettings are transaction-local settings a claim runs with, such as
// Config.LockTimeout or Citus's modes. They are statements sent before the
// claim (set) and after it (restore), in the same transaction.
type txSettings struct{ set, restore []string }

// statement is one SQL statement of a claim and what reads its answer.
type statement struct {
	sql  string
	args []any
	// row, when set, is called for each row the statement returns with a
	// function that scans it.
	row func(scan func(dest ...any) error) error
	// affected, when set, is called with the number of rows the statement
	// inserted, updated or deleted.
	affected func(n int64)
}

// queue adds cs, in order, to b, which may already hold a BEGIN.
func (cs claimStatements) queue(b *pgx.Batch) {
	for _, q := range cs.settings.set {
		b.Queue(q)
	}
	for _, st := range cs.claim {
		qq := b.Queue(st.sql, st.args...)
		if st.row == nil && st.affected == nil {
			continue
		}
		qq.Query(func(rows pgx.Rows) error {
			for rows.Next() {
				if st.row != nil {
					if err := st.row(rows.Scan); err != nil {
						return err
					}
				}
			}
			if err := rows.Err(); err != nil {
				return err
			}
			if st.affected != nil {
				st.affected(rows.CommandTag().RowsAffected())
			}
			return nil
		})
	}
	for _, q := range cs.settings.restore {
		b.Queue(q)
	}
}

// runSQL runs cs in tx, a database/sql transaction, which cannot pipeline.
// The settings on each side go as one Exec without arguments, which drivers
// send as one simple query in one round trip. Each claim statement is a round
// trip of its own. After a failed claim the restoring statements are skipped,
// because tx is aborted and will be rolled back anyway.
func (cs claimStatements) runSQL(ctx context.Context, tx *sql.Tx) error {
	if len(cs.settings.set) > 0 {
		if _, err := tx.ExecContext(ctx, strings.Join(cs.settings.set, "; ")); err != nil {
			return err
		}
	}
	for _, st := range cs.claim {
		if err := runSQLStatement(ctx, tx, st); err != nil {
			return err
		}
	}
	if len(cs.settings.restore) > 0 {
		_, err := tx.ExecContext(ctx, strings.Join(cs.settings.restore, "; "))
		return err
	}
	return nil
}

func runSQLStatement(ctx context.Context, tx *sql.Tx, st statement) error {
	if st.row == nil {
		res, err := tx.ExecContext(ctx, st.sql, sqlArgs(st.args)...)
		if err != nil || st.affected == nil {
			return err
		}
		n, err := res.RowsAffected()
		if err == nil {
			st.affected(n)
		}
		return err
	}
	rows, err := tx.QueryContext(ctx, st.sql, sqlArgs(st.args)...)
	if err != nil {
		return err
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		n++
		if err := st.row(rows.Scan); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if st.affected != nil {
		st.affected(n) // RETURNING gives one row per row written
	}
	return rows.Close()
}

// claimInTx runs c in tx, the caller's pgx transaction. It costs one round
// trip and never retries, since retrying is the business of whoever owns tx.
func (s *Store) claimInTx(ctx context.Context, tx pgx.Tx, c claim) error {
	if tx == nil {
		return errNilTx
	}
	l, err := s.layouts(ctx, pgxQueryRow(tx))
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	c.statements(l).queue(b)
	return s.claimDone(ctx, c, l, tx.SendBatch(ctx, b).Close())
}

// claimInSQLTx runs c in tx, the caller's database/sql transaction, with no
// retry.
func (s *Store) claimInSQLTx(ctx context.Context, tx *sql.Tx, c claim) error {
	if tx == nil {
		return errNilTx
	}
	l, err := s.layouts(ctx, sqlQueryRow(tx))
	if err != nil {
		return err
	}
	return s.claimDone(ctx, c, l, c.statements(l).runSQL(ctx, tx))
}

// claimDone turns the claim's answer into its outcome, its error, logs and
// events. It is the same for every kind of claim wherever it ran.
func (s *Store) claimDone(ctx context.Context, c claim, l *layouts, err error) error {
	if err != nil {
		err = s.claimError(c, l, err)
		if errors.Is(err, ErrInFlight) {
			s.log.DebugContext(ctx, "pgdedup: in flight elsewhere", "consumer", s.cfg.Consumer, "claim", c.subject())
			s.emit(ctx, Event{Kind: EventInFlight, MessageID: c.messageID(), Count: int64(c.size())})
		}
		return err
	}
	_, skipped, err := c.outcome()
	if err != nil {
		switch {
		case errors.Is(err, ErrFenced):
			s.log.WarnContext(ctx, "pgdedup: fenced", "consumer", s.cfg.Consumer, "claim", c.subject(), "error", err)
		case errors.Is(err, ErrPayloadMismatch):
			s.log.WarnContext(ctx, "pgdedup: payload mismatch", "consumer", s.cfg.Consumer, "claim", c.subject(), "error", err)
			s.emit(ctx, Event{Kind: EventPayloadMismatch, MessageID: c.messageID(), Count: 1, Err: err})
		}
		return err
	}
	if skipped > 0 {
		s.log.DebugContext(ctx, "pgdedup: skipped duplicate", "consumer", s.cfg.Consumer, "claim", c.subject(), "count", skipped)
		s.emit(ctx, Event{Kind: EventDuplicate, MessageID: c.messageID(), Count: int64(skipped)})
	}
	return nil
}

// claimError wraps err, the failure of c's statements, naming what was
// claimed and keeping the server's DETAIL. A lock timeout becomes
// ErrInFlight, and a missing table says to run Migrate. A failure of the
// database that a new transaction can cure is marked as such for
// IsTransient.
func (s *Store) claimError(c claim, l *layouts, err error) error {
	err = withDetail(err)
	code, _ := sqlState(err)
	switch {
	case code == "55P03" && s.messages.lockTimeoutMS > 0:
		return fmt.Errorf("%w: %s: %w", ErrInFlight, c.subject(), err)
	case code == "42P01":
		return fmt.Errorf("pgdedup: %s %s: %w (is %s or %s on the search_path? run pgdedup.Migrate or `pgdedup migrate up`)",
			action(c), c.subject(), err, s.messages.table, s.offsets.table)
	}
	return l.transient(fmt.Errorf("pgdedup: %s %s: %w", action(c), c.subject(), err))
}

// action names what c's statements do, for error messages. It is "claim"
// unless c says otherwise, as Forget's "forget" does.
func action(c claim) string {
	if a, ok := c.(interface{ action() string }); ok {
		return a.action()
	}
	return "claim"
}

// apply runs c's statements in a transaction of their own and commits,
// retrying failures of the database. It serves statements that change rows
// without running fn, such as Store.Forget. BEGIN and the statements go in one
// round trip, and COMMIT in a second.
func (s *Store) apply(ctx context.Context, c claim) error {
	return s.retry(ctx, c.messageID(), func() error {
		l, err := s.layouts(ctx, pgxQueryRow(s.db))
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.BeginTx(s.cfg.TxOptions)
		c.statements(l).queue(b)
		br := s.db.SendBatch(ctx, b)
		tx := br.Tx()
		defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
		if err := br.Close(); err != nil {
			return s.claimError(c, l, fromDatabase(err))
		}
		if _, _, err := c.outcome(); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return l.transient(fromDatabase(fmt.Errorf("pgdedup: commit %s %s: %w", action(c), c.subject(), withDetail(err))))
		}
		return nil
	})
}

// process runs fn for c's fresh items in a transaction that claims them, and
// commits, retrying failures of the database. It is the loop behind Process,
// ProcessBatch, ProcessResult and ProcessOffsets. BEGIN and the claim go in one
// round trip. It reports whether fn ran and committed.
func (s *Store) process(ctx context.Context, c claim, fn func(ctx context.Context, tx pgx.Tx) error) (committed bool, err error) {
	err = s.retry(ctx, c.messageID(), func() error {
		var err error
		committed, err = s.processOnce(ctx, c, fn)
		return err
	})
	return committed, err
}

func (s *Store) processOnce(ctx context.Context, c claim, fn func(ctx context.Context, tx pgx.Tx) error) (bool, error) {
	start := time.Now()
	l, err := s.layouts(ctx, pgxQueryRow(s.db))
	if err != nil {
		return false, err
	}
	b := &pgx.Batch{}
	b.BeginTx(s.cfg.TxOptions)
	c.statements(l).queue(b)
	br := s.db.SendBatch(ctx, b)
	tx := br.Tx()
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit, and pgx closes the connection on failure

	if err := s.claimDone(ctx, c, l, br.Close()); err != nil {
		return false, err
	}
	fresh, _, _ := c.outcome()
	if fresh == 0 {
		return false, tx.Rollback(ctx)
	}
	if err := fn(ctx, tx); err != nil {
		return false, fromFn(tx, l, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, l.transient(fromDatabase(fmt.Errorf("pgdedup: commit %s: %w", c.subject(), withDetail(err))))
	}
	s.emit(ctx, Event{Kind: EventProcessed, MessageID: c.messageID(), Count: int64(fresh), Duration: time.Since(start)})
	return true, nil
}

// queryRowFunc runs one single-row query and scans it. It wraps pgx's
// QueryRow on a pool, a transaction or a connection, or database/sql's
// QueryRowContext.
type queryRowFunc func(ctx context.Context, sql string, args []any, dest ...any) error

func pgxQueryRow(q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) queryRowFunc {
	return func(ctx context.Context, sql string, args []any, dest ...any) error {
		return q.QueryRow(ctx, sql, args...).Scan(dest...)
	}
}

func sqlQueryRow(tx *sql.Tx) queryRowFunc {
	return func(ctx context.Context, sql string, args []any, dest ...any) error {
		return tx.QueryRowContext(ctx, sql, args...).Scan(dest...)
	}
}

// emit reports e to Config.OnEvent, if set.
func (s *Store) emit(ctx context.Context, e Event) {
	if s.cfg.OnEvent != nil {
		e.Consumer = s.cfg.Consumer
		s.cfg.OnEvent(ctx, e)
	}
}
