package pgdedup

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// citusLayout is processed_messages distributed (or made a reference table)
// by Citus: the claim of one ID is the plain statement, which Citus routes to
// its shard; batches, cleanup and sizes differ.
type citusLayout struct {
	citusPlacement
	messages messageStatements
	values   *sync.Map // rows → the multi-row VALUES claim of that many rows
}

func newCitusLayout(m messageStatements) citusLayout {
	return citusLayout{citusPlacement: citusPlacement(m.lockTimeoutMS), messages: m, values: &sync.Map{}}
}

func (l citusLayout) claimOne(c *idClaim) []statement { return plainLayout{}.claimOne(c) }

func (l citusLayout) storeResult(c *idClaim, result []byte) statement {
	return plainLayout{}.storeResult(c, result)
}

// lookup and forget are the plain statements too: with every column of the
// key in their WHERE clauses, Citus routes them to the ID's shard.
func (l citusLayout) lookup(r *lookupRow) statement     { return plainLayout{}.lookup(r) }
func (l citusLayout) forget(c *forgetClaim) []statement { return forgetStatements(l, c) }

// claimMany claims the IDs as multi-row VALUES inserts of up to
// citusBatchMaxRows rows each (see citusBatchChunks).
func (l citusLayout) claimMany(c *batchClaim) []statement {
	var sts []statement
	for _, args := range citusBatchChunks(c.sorted) {
		sts = append(sts, statement{sql: l.batchSQL(len(args) / 2), args: append([]any{c.store.cfg.Consumer}, args...), row: c.addFresh})
	}
	return sts
}

func (l citusLayout) cleanup(ctx context.Context, s *Store, _ *Event) (int64, bool, error) {
	return s.cleanupCitus(ctx)
}

// sizes: the coordinator's own table is an empty shell; the rows are in the
// shards on the workers, which Citus's size functions add up. Dead tuples,
// vacuums and indexes are the workers' and are left empty.
func (l citusLayout) sizes(ctx context.Context, s *Store, st *Stats) error {
	err := s.db.QueryRow(ctx, `SELECT citus_table_size(r), citus_total_relation_size(r) FROM to_regclass($1::text) r`,
		s.messages.table).Scan(&st.TableBytes, &st.TotalBytes)
	if err != nil {
		return fmt.Errorf("pgdedup: stats of %s: read sizes: %w", s.messages.table, withDetail(err))
	}
	st.IndexBytes = st.TotalBytes - st.TableBytes
	return nil
}

// citusPlacement is a table Citus manages; its value is Config.LockTimeout in
// milliseconds (0: none).
type citusPlacement int64

// transient marks Citus's internal error XX000 as transient: a coordinator
// session whose worker connection failed (a worker crashed or restarted)
// fails once with "failure on connection marked as essential". The claim and
// COMMIT it comes from are safe to try again in a new transaction: a claim
// that failed committed nothing, and a COMMIT whose outcome is unknown is
// settled by the retry's duplicate check, as for a lost connection.
func (citusPlacement) transient(err error) error {
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) && pgErr.Code == "XX000" {
		return &connLostError{err}
	}
	return err
}

// settings returns the statements around a claim on a Citus table.
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
func (ms citusPlacement) settings(batch bool) txSettings {
	var a txSettings
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
	a.set = []string{`SELECT ` + strings.Join(save, ", ")}
	if ms > 0 {
		a.set = append(a.set, fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, int64(ms)))
		a.restore = []string{`SET LOCAL lock_timeout TO DEFAULT`}
	}
	a.restore = append(a.restore, `SELECT `+strings.Join(restore, ", "))
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

// batchSQL is the claim of rows IDs as one multi-row VALUES insert, $1
// the consumer and $2… the IDs and their keys, in pairs. Citus routes each row to its shard, where
// INSERT … SELECT FROM unnest (the plain statement) is pulled through the
// coordinator and opens a connection per shard, many times slower.
func (l citusLayout) batchSQL(rows int) string {
	if q, ok := l.values.Load(rows); ok {
		return q.(string)
	}
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + l.messages.table + ` (key, consumer, message_id, expires_at) VALUES `)
	for i := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "($%d::uuid, $1, $%d, %s)", 2*i+3, 2*i+2, l.messages.expires)
	}
	b.WriteString("\nON CONFLICT DO NOTHING\nRETURNING message_id")
	q := b.String()
	l.values.Store(rows, q)
	return q
}
