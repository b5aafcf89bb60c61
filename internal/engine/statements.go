package engine

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// Statements are the statements of one claim. With pgx they go in one
// round trip. They are the transaction-local settings the claim runs with,
// the claim itself, and the statements restoring the settings.
type Statements struct {
	Settings shape.Settings
	Claim    []shape.Statement
}

// queue adds cs, in order, to b, which may already hold a BEGIN.
func queue(b *pgx.Batch, cs Statements) {
	for _, q := range cs.Settings.Set {
		b.Queue(q)
	}
	for _, st := range cs.Claim {
		qq := b.Queue(st.SQL, st.Args...)
		if st.Row == nil && st.Affected == nil {
			continue
		}
		qq.Query(func(rows pgx.Rows) error {
			for rows.Next() {
				if st.Row != nil {
					if err := st.Row(rows.Scan); err != nil {
						return err
					}
				}
			}
			if err := rows.Err(); err != nil {
				return err
			}
			if st.Affected != nil {
				st.Affected(rows.CommandTag().RowsAffected())
			}
			return nil
		})
	}
	for _, q := range cs.Settings.Restore {
		b.Queue(q)
	}
}

// runSQL runs cs in tx, a database/sql transaction, which cannot pipeline.
// The settings on each side go as one Exec without arguments. Drivers send
// that as one simple query in one round trip. Each claim statement is a
// round trip of its own. After a failed claim the restoring statements are
// skipped, because tx is aborted and will be rolled back anyway.
func runSQL(ctx context.Context, tx *sql.Tx, cs Statements) error {
	if len(cs.Settings.Set) > 0 {
		if _, err := tx.ExecContext(ctx, strings.Join(cs.Settings.Set, "; ")); err != nil {
			return err
		}
	}
	for _, st := range cs.Claim {
		if err := runSQLStatement(ctx, tx, st); err != nil {
			return err
		}
	}
	if len(cs.Settings.Restore) > 0 {
		_, err := tx.ExecContext(ctx, strings.Join(cs.Settings.Restore, "; "))
		return err
	}
	return nil
}

func runSQLStatement(ctx context.Context, tx *sql.Tx, st shape.Statement) error {
	if st.Row == nil {
		res, err := tx.ExecContext(ctx, st.SQL, sqlArgs(st.Args)...)
		if err != nil || st.Affected == nil {
			return err
		}
		n, err := res.RowsAffected()
		if err == nil {
			st.Affected(n)
		}
		return err
	}
	rows, err := tx.QueryContext(ctx, st.SQL, sqlArgs(st.Args)...)
	if err != nil {
		return err
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		n++
		if err := st.Row(rows.Scan); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if st.Affected != nil {
		st.Affected(n) // RETURNING gives one row per row written
	}
	return rows.Close()
}

// sqlArgs returns args with every []string written as a Postgres array
// literal (see textArray). This serves drivers without array support of
// their own.
func sqlArgs(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		if ss, ok := a.([]string); ok {
			a = textArray(ss)
		}
		out[i] = a
	}
	return out
}

// textArray is a text[] parameter as a Postgres array literal. Every element
// is quoted, so no element is read as NULL. Commas or braces in IDs are
// data. Inside quotes only " and \ need a backslash.
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
