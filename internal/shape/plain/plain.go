// Package plain is the plain shape of the dedup table: one table with one
// unique index on key, as the migrations create it. Its cleanup deletes
// expired rows in batches, and cleaners take turns (turn.go).
package plain

import (
	"context"
	"fmt"
	"time"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// Statements are the SQL for the dedup table, built once per Store. The
// table name is quoted. The retention and the lock timeout are integers
// formatted here. The consumer and the IDs are always bound parameters.
type Statements struct {
	Table   string // quoted, possibly schema-qualified
	Expires string // the expires_at expression
	// ClaimWith are the claims of one ID by variant (see ClaimRetention).
	// ClaimWith[0] is the claim without options. The others add $4 the
	// retention in microseconds and the fingerprint, in that order.
	ClaimWith         [4]string
	StoredFingerprint string // $1 consumer, $2 id, $3 key
	StoredResult      string // $1 consumer, $2 id, $3 key
	StoreResult       string // $1 consumer, $2 id, $3 key, $4 result
	ClaimBatch        string // $1 consumer, $2 ids, $3 their keys, sorted by key
	Lookup            string // $1 consumer, $2 id, $3 key
	Forget            string // $1 consumer, $2 id, $3 key
	LockTimeoutMS     int64  // Config.LockTimeout in milliseconds, rounded up. Zero means none.
}

// The bits of a claim's variant say which options change its statement.
const (
	ClaimRetention   = 1 // WithRetention sets expires_at from $4.
	ClaimFingerprint = 2 // WithFingerprint fills the fingerprint column.
)

// NewStatements builds the statements for table t (quoted).
func NewStatements(t string, retention, lockTimeout time.Duration) Statements {
	expires := fmt.Sprintf("now() + interval '%d microseconds'", retention.Microseconds())
	where := ` WHERE key = $3::uuid AND consumer = $1 AND message_id = $2`
	m := Statements{
		Table:   t,
		Expires: expires,
		ClaimBatch: `INSERT INTO ` + t + ` (key, consumer, message_id, expires_at)
SELECT k, $1, id, ` + expires + ` FROM unnest($3::uuid[], $2::text[]) WITH ORDINALITY AS u(k, id, n) ORDER BY n
ON CONFLICT DO NOTHING
RETURNING message_id`,
		// Every column of the key is in the WHERE clause. Citus then routes
		// the statement to one shard whichever column distributes the table.
		Lookup:        `SELECT processed_at, expires_at FROM ` + t + ` WHERE key = $3::uuid AND consumer = $1 AND message_id = $2`,
		Forget:        `DELETE FROM ` + t + ` WHERE key = $3::uuid AND consumer = $1 AND message_id = $2`,
		LockTimeoutMS: int64((lockTimeout + time.Millisecond - 1) / time.Millisecond),
		// A row is the ID's record until it is deleted, expired or not.
		StoredFingerprint: `SELECT fingerprint FROM ` + t + where,
		StoredResult:      `SELECT fingerprint, result FROM ` + t + where,
		StoreResult:       `UPDATE ` + t + ` SET result = $4` + where,
	}
	m.ClaimWith[0] = `INSERT INTO ` + t + ` (key, consumer, message_id, expires_at) VALUES ($3::uuid, $1, $2, ` + expires + `)
ON CONFLICT DO NOTHING`
	for v := 1; v < len(m.ClaimWith); v++ {
		cols, values, n := "", "", 4
		exp := expires
		if v&ClaimRetention != 0 {
			exp = fmt.Sprintf("now() + $%d::bigint * interval '1 microsecond'", n)
			n++
		}
		if v&ClaimFingerprint != 0 {
			cols, values = ", fingerprint", fmt.Sprintf(", $%d::bytea", n)
		}
		m.ClaimWith[v] = `INSERT INTO ` + t + ` (key, consumer, message_id, expires_at` + cols + `) VALUES ($3::uuid, $1, $2, ` + exp + values + `)
ON CONFLICT DO NOTHING`
	}
	return m
}

// Placement is a table on one PostgreSQL server. Its value is
// Config.LockTimeout in milliseconds. Zero means none.
type Placement int64

// Settings bound the claim's wait with Config.LockTimeout. The claim runs
// between saving the caller's lock_timeout and setting ours, and restoring
// it. So lock_timeout is unchanged for the rest of the transaction. All of
// them are transaction-local (set_config's is_local).
func (ms Placement) Settings(bool) shape.Settings {
	if ms == 0 {
		return shape.Settings{}
	}
	return shape.Settings{
		Set: []string{
			`SELECT set_config('pgdedup.lock_timeout', current_setting('lock_timeout'), true)`,
			fmt.Sprintf(`SELECT set_config('lock_timeout', '%dms', true)`, int64(ms)),
		},
		Restore: []string{`SELECT set_config('lock_timeout', current_setting('pgdedup.lock_timeout'), true)`},
	}
}

// Transient returns err as it is.
func (Placement) Transient(err error) error { return err }

// Shape is the plain dedup table on one PostgreSQL server.
type Shape struct {
	Placement
	env shape.Env
	sql Statements
}

// New returns the plain shape of env's table, with its statements.
func New(env shape.Env, sql Statements) Shape {
	return Shape{Placement: Placement(sql.LockTimeoutMS), env: env, sql: sql}
}

// Statements returns the shape's statements.
func (l Shape) Statements() Statements { return l.sql }

// ClaimOne is one INSERT … ON CONFLICT DO NOTHING, the same statement for
// every call without options. A fingerprint or a stored result adds a
// SELECT (see ClaimOneWith).
func (l Shape) ClaimOne(c shape.One) []shape.Statement {
	return ClaimOneWith(c, l.sql, l.sql.ClaimWith)
}

// ClaimOneWith is a shape's ClaimOne, given its claims by variant. With a
// fingerprint, or for a stored result, a SELECT follows. It is a statement
// of its own, so its snapshot is taken after the INSERT waited for a
// transaction holding the ID. It then sees that transaction's row.
func ClaimOneWith(c shape.One, sql Statements, claimWith [4]string) []shape.Statement {
	args := c.Args()
	variant, claimArgs := 0, args
	if c.Retention != 0 {
		variant |= ClaimRetention
		claimArgs = append(claimArgs[:len(claimArgs):len(claimArgs)], c.Retention.Microseconds())
	}
	if c.Fingerprint != nil {
		variant |= ClaimFingerprint
		claimArgs = append(claimArgs[:len(claimArgs):len(claimArgs)], c.Fingerprint)
	}
	claimed := c.Claimed
	sts := []shape.Statement{{SQL: claimWith[variant], Args: claimArgs, Affected: func(n int64) { *claimed = n == 1 }}}
	switch {
	case c.WithResult:
		sts = append(sts, shape.Statement{SQL: sql.StoredResult, Args: args, Row: c.Stored})
	case c.Fingerprint != nil:
		sts = append(sts, shape.Statement{SQL: sql.StoredFingerprint, Args: args, Row: c.Stored})
	}
	return sts
}

// StoreResult updates the ID's row, or every copy of it.
func (l Shape) StoreResult(id shape.ID, result []byte) shape.Statement {
	return shape.Statement{SQL: l.sql.StoreResult, Args: append(id.Args(), result)}
}

// ClaimMany is one INSERT … SELECT FROM unnest, whatever the batch size.
func (l Shape) ClaimMany(c shape.Many) []shape.Statement {
	return []shape.Statement{{SQL: l.sql.ClaimBatch, Args: []any{c.Consumer, c.IDs, c.Keys}, Row: c.Fresh}}
}

// Lookup reads the ID's row.
func (l Shape) Lookup(id shape.ID, row shape.RowFunc) shape.Statement {
	return shape.Statement{SQL: l.sql.Lookup, Args: id.Args(), Row: row}
}

// Delete deletes the ID's rows.
func (l Shape) Delete(id shape.ID, affected func(int64)) shape.Statement {
	return shape.Statement{SQL: l.sql.Forget, Args: id.Args(), Affected: affected}
}

// Cleanup deletes expired rows in batches (cleanup.go).
func (l Shape) Cleanup(ctx context.Context, _ *shape.Report) (int64, bool, error) {
	return Cleanup(ctx, l.env)
}

// Sizes reads the table's dead tuples, vacuums and indexes (cleanup.go).
func (l Shape) Sizes(ctx context.Context, st *shape.Sizes) error {
	return Sizes(ctx, l.env, st)
}
