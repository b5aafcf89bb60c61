// Package citus is the Citus placement of the dedup table. The table is
// distributed by Citus and reached through the coordinator. The package
// holds the settings that route a claim. It holds the batch statements and
// the windowed cleanup of the plain shape on Citus (Plain). And it holds
// what the partitioned shape asks of a distributed table (Partitioned). That
// is its claim function, its detach, and the two-phase-commit checks of
// sealing.
package citus

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdedup/pgdedup/internal/shape"
	"github.com/pgdedup/pgdedup/internal/shape/plain"
)

// Placement is a table Citus manages. Its value is Config.LockTimeout in
// milliseconds. Zero means none.
type Placement int64

// Transient marks Citus's internal error XX000 as transient. A coordinator
// session whose worker connection failed fails once with "failure on
// connection marked as essential". That happens when a worker crashed or
// restarted. The claim and COMMIT it comes from are safe to try again in a
// new transaction. A claim that failed committed nothing. A COMMIT whose
// outcome is unknown is settled by the retry's duplicate check, as for a
// lost connection.
func (Placement) Transient(err error) error {
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) && pgErr.Code == "XX000" {
		return &shape.ConnLostError{Err: err}
	}
	return err
}

// Settings returns the statements around a claim on a Citus table.
//
// Config.LockTimeout bounds the wait for another transaction's claim. That
// wait happens on the worker holding the shard, and set_config on the
// coordinator never reaches it. A SET LOCAL statement does when
// citus.propagate_set_commands is 'local'. The coordinator then sends it to
// the workers the transaction uses, and to those it opens later.
// Afterwards SET LOCAL lock_timeout TO DEFAULT, propagated too, gives the
// workers back their own setting. set_config restores the coordinator's
// lock_timeout and propagate_set_commands to what the caller had.
//
// A batch runs with citus.multi_shard_modify_mode 'sequential'. A
// multi-shard INSERT then goes through one connection per worker, shard
// after shard in shard order, instead of one connection per shard in
// parallel. Overlapping batches take their rows' locks in the same order,
// so they cannot deadlock across nodes. A consumer holds one connection per
// worker, not one per shard. The mode is restored afterwards as well.
func (ms Placement) Settings(batch bool) shape.Settings {
	var a shape.Settings
	var save, restore []string
	if ms > 0 {
		save = append(save,
			`set_config('pgdedup.lock_timeout', current_setting('lock_timeout'), true)`,
			`set_config('pgdedup.propagate_set_commands', current_setting('citus.propagate_set_commands'), true)`,
			`set_config('citus.propagate_set_commands', 'local', true)`)
		restore = append(restore,
			`set_config('lock_timeout', current_setting('pgdedup.lock_timeout'), true)`,
			`set_config('citus.propagate_set_commands', current_setting('pgdedup.propagate_set_commands'), true)`)
	}
	if batch {
		save = append(save,
			`set_config('pgdedup.multi_shard_modify_mode', current_setting('citus.multi_shard_modify_mode'), true)`,
			`set_config('citus.multi_shard_modify_mode', 'sequential', true)`)
		restore = append(restore,
			`set_config('citus.multi_shard_modify_mode', current_setting('pgdedup.multi_shard_modify_mode'), true)`)
	}
	if len(save) == 0 {
		return a
	}
	a.Set = []string{`SELECT ` + strings.Join(save, ", ")}
	if ms > 0 {
		a.Set = append(a.Set, fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, int64(ms)))
		a.Restore = []string{`SET LOCAL lock_timeout TO DEFAULT`}
	}
	a.Restore = append(a.Restore, `SELECT `+strings.Join(restore, ", "))
	return a
}

// Plain is the plain shape on a table that Citus distributes, or has made
// a reference table. The claim of one ID is the plain statement, which
// Citus routes to its shard. So are Lookup and Delete, which name every
// column of the key. Batches, cleanup and sizes differ.
type Plain struct {
	plain.Shape
	Placement
	env    shape.Env
	values *sync.Map // rows → the multi-row VALUES claim of that many rows
}

// NewPlain returns the plain shape of env's table on Citus.
func NewPlain(env shape.Env, sql plain.Statements) Plain {
	return Plain{Shape: plain.New(env, sql), Placement: Placement(sql.LockTimeoutMS), env: env, values: &sync.Map{}}
}

// ClaimMany claims the IDs as multi-row VALUES inserts of up to
// batchMaxRows rows each (see batchChunks).
func (l Plain) ClaimMany(c shape.Many) []shape.Statement {
	var sts []shape.Statement
	for _, args := range batchChunks(c.IDs, c.Keys) {
		sts = append(sts, shape.Statement{SQL: l.batchSQL(len(args) / 2), Args: append([]any{c.Consumer}, args...), Row: c.Fresh})
	}
	return sts
}

// Cleanup deletes expired rows by windows of expires_at (cleanup.go).
func (l Plain) Cleanup(ctx context.Context, _ *shape.Report) (int64, bool, error) {
	return cleanup(ctx, l.env)
}

// Sizes are the shards' total. The coordinator's own table is an empty
// shell, and the rows are in the shards on the workers. Citus's size
// functions add them up. Dead tuples, vacuums and indexes are the workers'
// and are left empty.
func (l Plain) Sizes(ctx context.Context, st *shape.Sizes) error {
	err := l.env.DB.QueryRow(ctx, `SELECT citus_table_size(r), citus_total_relation_size(r) FROM to_regclass($1::text) r`,
		l.env.Table).Scan(&st.TableBytes, &st.TotalBytes)
	if err != nil {
		return fmt.Errorf("pgdedup: stats of %s: read sizes: %w", l.env.Table, shape.WithDetail(err))
	}
	st.IndexBytes = st.TotalBytes - st.TableBytes
	return nil
}

// batchMaxRows is the most rows one multi-row VALUES claim carries. Two
// bind parameters per ID (the ID and its key) plus the consumer stay under
// PostgreSQL's 65,535.
const batchMaxRows = 1 << 14

// batchChunks splits sorted IDs into the chunks of one claim statement
// each, as arguments id, key, id, key…. It pads each chunk to a power of
// two rows by repeating its last ID. So a Store prepares at most 16
// distinct statements whatever its batch sizes. A repeated ID is harmless.
// ON CONFLICT DO NOTHING skips the repeat, and RETURNING reports the ID
// once.
func batchChunks(ids, keys []string) [][]any {
	var chunks [][]any
	for len(ids) > 0 {
		n := min(len(ids), batchMaxRows)
		rows := 1 << bits.Len(uint(n-1))
		args := make([]any, 0, 2*rows)
		for i := range n {
			args = append(args, ids[i], keys[i])
		}
		for len(args) < 2*rows {
			args = append(args, ids[n-1], keys[n-1])
		}
		chunks = append(chunks, args)
		ids, keys = ids[n:], keys[n:]
	}
	return chunks
}

// batchSQL is the claim of rows IDs as one multi-row VALUES insert. $1 is
// the consumer and $2… are the IDs and their keys, in pairs. Citus routes
// each row to its shard. The plain statement, INSERT … SELECT FROM unnest,
// is pulled through the coordinator and opens a connection per shard, many
// times slower.
func (l Plain) batchSQL(rows int) string {
	if q, ok := l.values.Load(rows); ok {
		return q.(string)
	}
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + l.env.Table + ` (key, consumer, message_id, expires_at) VALUES `)
	for i := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "($%d::uuid, $1, $%d, %s)", 2*i+3, 2*i+2, l.Statements().Expires)
	}
	b.WriteString("\nON CONFLICT DO NOTHING\nRETURNING message_id")
	q := b.String()
	l.values.Store(rows, q)
	return q
}
