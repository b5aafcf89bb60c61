package pgdedup

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
)

// ClaimSQL is [Store.Claim] for services that reach Postgres through database/sql
// (sqlc, sqlx, bun, GORM over pgx's stdlib driver): it records messageID for
// the [Store]'s consumer inside tx and reports whether it is new. The claim
// commits or rolls back with tx, so run the business write in tx only when
// claimed is true.
//
// It runs the same statement as Claim, with the same validation, and behaves
// the same: a duplicate returns (false, nil) and leaves tx usable; another
// transaction holding the ID is waited for, or, with [Config.LockTimeout], gives
// [ErrInFlight] after which tx is aborted and must be rolled back. It does not
// retry. The Store's own [DB] is not used; tx may come from any *sql.DB on the
// same database.
//
// Without Config.LockTimeout the claim is one round trip. With it, database/sql
// cannot pipeline as pgx does, so it costs three: the transaction-local timeout
// is set (one multi-statement Exec without arguments), the claim runs, and the
// previous lock_timeout is restored.
func (s *Store) ClaimSQL(ctx context.Context, tx *sql.Tx, messageID string) (claimed bool, err error) {
	if err := ValidateMessageID(messageID); err != nil {
		return false, err
	}
	if tx == nil {
		return false, errNilTx
	}
	a, err := s.singleAround(ctx, sqlQueryRow(tx))
	if err != nil {
		return false, err
	}
	var n int64
	err = sqlAround(ctx, tx, a, func() error {
		res, err := tx.ExecContext(ctx, s.sql.claim, s.cfg.Consumer, messageID, Key(s.cfg.Consumer, messageID))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return false, s.sqlClaimError(err, messageID)
	}
	return n == 1, nil
}

// ClaimBatchSQL is [Store.ClaimBatch] for database/sql: it records messageIDs inside tx
// and returns the ones that are new, in the order they first appear in
// messageIDs, each once. It runs ClaimBatch's single statement, sorted the same
// way so that overlapping batches cannot deadlock, and rejects the whole batch
// with [ErrInvalidMessageID], naming the index, if any ID is invalid, before
// anything is sent. Round trips and [Config.LockTimeout] are as in [Store.ClaimSQL].
//
// The IDs and their keys travel as two array parameters written as Postgres
// array literals, so no driver-specific array type is needed.
func (s *Store) ClaimBatchSQL(ctx context.Context, tx *sql.Tx, messageIDs []string) (fresh []string, err error) {
	sorted, err := prepareBatch(s.cfg.Consumer, messageIDs)
	if err != nil || len(sorted.ids) == 0 {
		return nil, err
	}
	if tx == nil {
		return nil, errNilTx
	}
	l, err := s.layout(ctx, sqlQueryRow(tx))
	if err != nil {
		return nil, err
	}
	got := make(map[string]struct{}, len(sorted.ids))
	collect := func(sql string, args ...any) error {
		rows, err := tx.QueryContext(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			got[id] = struct{}{}
		}
		return rows.Err()
	}
	if !l.citus {
		err = sqlAround(ctx, tx, s.sql.lockTimeout, func() error {
			return collect(s.sql.claimBatch, s.cfg.Consumer, textArray(sorted.ids), textArray(sorted.keys))
		})
	} else {
		err = sqlAround(ctx, tx, l.batch, func() error {
			for _, args := range citusBatchChunks(sorted) {
				if err := collect(s.citusBatchSQL(l, len(args)/2), append([]any{s.cfg.Consumer}, args...)...); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err != nil {
		return nil, s.sqlClaimError(err, "")
	}
	return inInputOrder(messageIDs, got), nil
}

var errNilTx = errors.New("pgdedup: tx must not be nil")

// sqlAround runs claim between a's statements, as queueAround does for pgx.
// The statements on each side go as one Exec without arguments, which drivers
// send as a simple query, so they cost one round trip each and run in order.
// After a failed claim the statements after it are skipped: tx is aborted and
// will be rolled back anyway.
func sqlAround(ctx context.Context, tx *sql.Tx, a around, claim func() error) error {
	if len(a.before) > 0 {
		if _, err := tx.ExecContext(ctx, strings.Join(a.before, "; ")); err != nil {
			return err
		}
	}
	if err := claim(); err != nil {
		return err
	}
	if len(a.after) > 0 {
		_, err := tx.ExecContext(ctx, strings.Join(a.after, "; "))
		return err
	}
	return nil
}

// sqlQueryRow is queryRowFunc for a database/sql transaction.
func sqlQueryRow(tx *sql.Tx) queryRowFunc {
	return func(ctx context.Context, sql string, args []any, dest ...any) error {
		return tx.QueryRowContext(ctx, sql, args...).Scan(dest...)
	}
}

// sqlClaimError is claimError for errors from any database/sql driver: besides
// pgx's *pgconn.PgError, it recognises the lock timeout by the SQLState method
// that drivers' error types offer.
func (s *Store) sqlClaimError(err error, id string) error {
	var st interface{ SQLState() string }
	if errors.As(err, &st) && st.SQLState() == "55P03" && s.sql.lockTimeoutMS > 0 {
		return fmt.Errorf("%w: %w", ErrInFlight, err)
	}
	return s.claimError(err, id)
}

// textArray is a text[] parameter as a Postgres array literal. Every element
// is quoted, so no element is read as NULL and commas or braces in IDs are
// data; inside quotes only " and \ need a backslash.
type textArray []string

// Value implements driver.Valuer.
func (a textArray) Value() (driver.Value, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range a {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for j := 0; j < len(s); j++ {
			if s[j] == '"' || s[j] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(s[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String(), nil
}
