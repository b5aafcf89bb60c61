package pgdedup

import (
	"context"
	"fmt"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// layout is what a Store learned about its table on first use: whether Citus
// manages it (a distributed or reference table, listed in pg_dist_partition),
// and the statements that differ there. It is looked up once per Store, lazily
// and only by the calls whose SQL depends on it: ClaimBatch and ProcessBatch,
// Claim and Process with Config.LockTimeout, and Cleanup. Process and Claim
// without LockTimeout send the same statement everywhere and never look.
//
// On plain PostgreSQL the lookup is one query, once per Store. A table
// distributed after the Store's first use keeps the plain statements until the
// Store is recreated: distribute before starting consumers.
type layout struct {
	citus bool

	// Citus only: the statements around a claim (see citusAround) and the
	// claim batch as multi-row VALUES, by row count (see citusBatchSQL).
	single, batch around
	values        sync.Map // int (rows) → string
}

// around are the statements sent before and after a claim in the same
// pipeline, each a statement of its own.
type around struct{ before, after []string }

// layoutQuery finds whether Citus manages the table, without referencing
// Citus's catalog (absent on plain PostgreSQL) in the statement itself.
const (
	layoutQuery      = `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL, to_regclass($1) IS NOT NULL`
	citusLayoutQuery = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1))`
)

// queryRowFunc runs one single-row query and scans it: pgx's QueryRow on a
// pool, a transaction or a connection, or database/sql's QueryRowContext.
type queryRowFunc func(ctx context.Context, sql string, args []any, dest ...any) error

// layout returns the table's layout, looking it up with query on first use.
// A missing table is not cached: the claim that follows reports it.
func (s *Store) layout(ctx context.Context, query queryRowFunc) (*layout, error) {
	if l := s.lay.Load(); l != nil {
		return l, nil
	}
	var citusInstalled, exists bool
	if err := query(ctx, layoutQuery, []any{s.sql.table}, &citusInstalled, &exists); err != nil {
		return nil, fromDatabase(fmt.Errorf("pgdedup: look up %s: %w", s.sql.table, withDetail(err)))
	}
	l := &layout{}
	if citusInstalled && exists {
		if err := query(ctx, citusLayoutQuery, []any{s.sql.table}, &l.citus); err != nil {
			return nil, fromDatabase(fmt.Errorf("pgdedup: look up %s in pg_dist_partition: %w", s.sql.table, withDetail(err)))
		}
	}
	if l.citus {
		l.single = citusAround(s.sql.lockTimeoutMS, false)
		l.batch = citusAround(s.sql.lockTimeoutMS, true)
	}
	if exists {
		s.lay.Store(l)
	}
	return l, nil
}

// layoutPtr is embedded in Store; a type of its own keeps the zero value usable.
type layoutPtr struct{ atomic.Pointer[layout] }

func pgxQueryRow(q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) queryRowFunc {
	return func(ctx context.Context, sql string, args []any, dest ...any) error {
		return q.QueryRow(ctx, sql, args...).Scan(dest...)
	}
}

// citusAround returns the statements around a claim on a Citus table.
//
// Config.LockTimeout: the wait for another transaction's claim happens on the
// worker holding the shard, and set_config on the coordinator never reaches it.
// A SET LOCAL statement does when citus.propagate_set_commands is 'local': the
// coordinator sends it to the workers the transaction uses, and to those it
// opens later. Afterwards SET LOCAL lock_timeout TO DEFAULT, propagated too,
// gives the workers back their own setting, and set_config restores the
// coordinator's lock_timeout and propagate_set_commands to what the caller had.
//
// Batches: citus.multi_shard_modify_mode 'sequential' sends a multi-shard
// INSERT through one connection per worker, shard after shard in shard order,
// instead of one connection per shard in parallel: overlapping batches then
// take their rows' locks in the same order (no distributed deadlock) and a
// consumer holds one connection per worker, not one per shard. It is restored
// afterwards as well.
func citusAround(lockTimeoutMS int64, batch bool) around {
	var a around
	var save, restore []string
	if lockTimeoutMS > 0 {
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
	a.before = []string{`SELECT ` + strings.Join(save, ", ")}
	if lockTimeoutMS > 0 {
		a.before = append(a.before, fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, lockTimeoutMS))
		a.after = []string{`SET LOCAL lock_timeout TO DEFAULT`}
	}
	a.after = append(a.after, `SELECT `+strings.Join(restore, ", "))
	return a
}

// citusBatchMaxRows is the most rows one multi-row VALUES claim carries: two
// bind parameters per ID (the ID and its key) plus the consumer stay under
// PostgreSQL's 65,535.
const citusBatchMaxRows = 1 << 14

// citusBatchChunks splits sorted IDs into the chunks of one claim statement
// each, as arguments id, key, id, key…, and pads each chunk to a power of two
// rows by repeating its last ID, so
// that a Store prepares at most 16 distinct statements whatever its batch
// sizes. A repeated ID is harmless: ON CONFLICT DO NOTHING skips the repeat
// and RETURNING reports the ID once.
func citusBatchChunks(sorted sortedBatch) [][]any {
	var chunks [][]any
	ids, keys := sorted.ids, sorted.keys
	for len(ids) > 0 {
		n := min(len(ids), citusBatchMaxRows)
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

// citusBatchSQL is the claim of rows IDs as one multi-row VALUES insert, $1
// the consumer and $2… the IDs and their keys, in pairs. Citus routes each row to its shard, where
// INSERT … SELECT FROM unnest (the plain statement) is pulled through the
// coordinator and opens a connection per shard: about 1 s for 1,000 IDs,
// against tens of milliseconds.
func (s *Store) citusBatchSQL(l *layout, rows int) string {
	if q, ok := l.values.Load(rows); ok {
		return q.(string)
	}
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + s.sql.table + ` (key, consumer, message_id, expires_at) VALUES `)
	for i := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "($%d::uuid, $1, $%d, %s)", 2*i+3, 2*i+2, s.sql.expires)
	}
	b.WriteString("\nON CONFLICT DO NOTHING\nRETURNING message_id")
	q := b.String()
	l.values.Store(rows, q)
	return q
}
