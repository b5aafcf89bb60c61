package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
)

// growthConfig is the command line of -only growth.
type growthConfig struct {
	rows     int           // rows of the big table
	versions []int         // schema versions measured: 2 (before migration 00003) and/or 3
	keep     bool          // keep the loaded tables for the next run (and reuse them)
	steady   time.Duration // per version: Process on the big table alone, for WAL across checkpoints; 0 skips
}

// growthSteady is the steady phase of one version: Process with the most
// workers on the big table alone, from a CHECKPOINT on, for growthConfig.steady.
type growthSteady struct {
	version     int
	workers     int
	sample      sample
	walBytes    int64
	fpis        int64 // full-page images written, from pg_stat_wal
	checkpoints int64
}

// growthTable is one dedup table of the growth part: a schema of its own
// holding processed_messages at one migration version, with rows rows loaded,
// and the business table ledger.
type growthTable struct {
	version int
	rows    int
	schema  string
	pool    *pgxpool.Pool
	store   *pgdedup.Store // version 3 only
}

func (t *growthTable) name() string {
	if t.rows == 0 {
		return "empty"
	}
	return rowsLabel(t.rows) + " rows"
}

// growthScenario is one way of claiming: Process of one message, or a
// ClaimBatch of 100 new IDs in a transaction of its own.
type growthScenario struct {
	key, title string
	perOp      int // messages per operation
}

var growthScenarios = []growthScenario{
	{"process", "Process", 1},
	{"batch", "ClaimBatch of 100", 100},
}

// growthResult is one (version, table, workers, scenario): a sample per round
// and the WAL the rounds wrote.
type growthResult struct {
	rounds   series
	walBytes int64
	messages int64
}

func (r *growthResult) walPerMsg() float64 {
	if r.messages == 0 {
		return 0
	}
	return float64(r.walBytes) / float64(r.messages)
}

type growthKey struct {
	version, rows, workers int
	scenario               string
}

// growthSize is a table's size after the run.
type growthSize struct {
	version, rows  int
	heap, toastEtc int64
	indexes        []indexSize
	rowsAfter      int64
	avgLeafDensity float64 // of the primary key, from pgstattuple, 0 if unknown
}

type indexSize struct {
	name  string
	bytes int64
}

// growthReport is what -only growth measured.
type growthReport struct {
	cfg         growthConfig
	settings    string
	results     map[growthKey]*growthResult
	sizes       []growthSize
	checkpoints int64
	elapsed     time.Duration
	loadTook    map[int]time.Duration // per version, the big table's load (0: reused)
	steady      []growthSteady
}

// runGrowth measures, per schema version, Process and ClaimBatch on an empty
// table and on one of cfg.growth.rows rows, in interleaved rounds: each round
// runs every (scenario, table) once, the order rotating, so drift of the
// shared machine hits both tables alike. WAL is the server's insert LSN
// difference across each sample (so it counts every session: run it on a
// server of its own); a CHECKPOINT starts the measured part, and the report
// gives how many checkpoints happened during it.
func (b *bench) runGrowth(ctx context.Context, prog *progress) (*growthReport, error) {
	g := b.cfg.growth
	rep := &growthReport{cfg: g, results: map[growthKey]*growthResult{}, loadTook: map[int]time.Duration{}}
	var tables []*growthTable
	defer func() {
		for _, t := range tables {
			t.close(b, g.keep)
		}
	}()
	for _, v := range g.versions {
		for _, rows := range []int{0, g.rows} {
			prog.step("growth: table v%d, %s rows", v, rowsLabel(rows))
			t0 := time.Now()
			t, loaded, err := b.growthTable(ctx, v, rows, g.keep)
			if err != nil {
				return nil, err
			}
			if loaded && rows > 0 {
				rep.loadTook[v] = time.Since(t0)
			}
			tables = append(tables, t)
		}
	}
	if err := b.admin.QueryRow(ctx, `SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name) FROM pg_settings
WHERE name IN ('shared_buffers', 'max_wal_size', 'checkpoint_timeout', 'wal_compression', 'full_page_writes', 'autovacuum', 'synchronous_commit')`).Scan(&rep.settings); err != nil {
		return nil, err
	}
	if _, err := b.admin.Exec(ctx, `CHECKPOINT`); err != nil {
		return nil, err
	}
	ckpt0, err := b.checkpoints(ctx)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	for _, workers := range b.cfg.workers {
		for r := range b.cfg.rounds + 1 {
			cases := len(growthScenarios) * len(tables)
			for i := range cases {
				j := (i + r) % cases
				sc, t := growthScenarios[j/len(tables)], tables[j%len(tables)]
				d := b.cfg.round
				if r == 0 {
					d = b.cfg.round / 4
				}
				prog.step("growth: workers=%d, round %d/%d: v%d %s, %s", workers, r, b.cfg.rounds, t.version, t.name(), sc.title)
				var lsn0, lsn1 int64
				if err := b.admin.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint`).Scan(&lsn0); err != nil {
					return nil, err
				}
				got, err := measure(ctx, workers, d, nil, func(ctx context.Context, _ int) error {
					return t.claim(ctx, sc)
				})
				if err != nil {
					return nil, fmt.Errorf("growth: v%d %s, %s: %w", t.version, t.name(), sc.title, err)
				}
				if err := b.admin.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint`).Scan(&lsn1); err != nil {
					return nil, err
				}
				if r == 0 {
					continue
				}
				k := growthKey{t.version, t.rows, workers, sc.key}
				res := rep.results[k]
				if res == nil {
					res = &growthResult{}
					rep.results[k] = res
				}
				res.rounds = append(res.rounds, got)
				res.walBytes += lsn1 - lsn0
				res.messages += int64(got.ops * sc.perOp)
			}
		}
	}
	rep.elapsed = time.Since(start)
	ckpt1, err := b.checkpoints(ctx)
	if err != nil {
		return nil, err
	}
	rep.checkpoints = ckpt1 - ckpt0
	if g.steady > 0 {
		for _, t := range tables {
			if t.rows == 0 {
				continue
			}
			prog.step("growth: steady, v%d %s, %s", t.version, t.name(), g.steady)
			st, err := b.growthSteady(ctx, t)
			if err != nil {
				return nil, err
			}
			rep.steady = append(rep.steady, st)
		}
	}
	for _, t := range tables {
		s, err := t.size(ctx, b)
		if err != nil {
			return nil, err
		}
		rep.sizes = append(rep.sizes, s)
	}
	return rep, nil
}

// growthSteady runs Process with the most workers on t alone for
// growthConfig.steady, from a CHECKPOINT on, and measures the WAL it wrote:
// long enough to span checkpoint cycles, it is the WAL per message of a
// server that does nothing else.
func (b *bench) growthSteady(ctx context.Context, t *growthTable) (growthSteady, error) {
	st := growthSteady{version: t.version, workers: slicesMax(b.cfg.workers)}
	if _, err := b.admin.Exec(ctx, `CHECKPOINT`); err != nil {
		return st, err
	}
	ckpt0, err := b.checkpoints(ctx)
	if err != nil {
		return st, err
	}
	var lsn0, lsn1, fpi0, fpi1 int64
	walStats := `SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint, coalesce((SELECT wal_fpi FROM pg_stat_wal), 0)`
	if err := b.admin.QueryRow(ctx, walStats).Scan(&lsn0, &fpi0); err != nil {
		return st, err
	}
	st.sample, err = measure(ctx, st.workers, b.cfg.growth.steady, nil, func(ctx context.Context, _ int) error {
		return t.claim(ctx, growthScenarios[0])
	})
	if err != nil {
		return st, fmt.Errorf("growth: steady v%d: %w", t.version, err)
	}
	if err := b.admin.QueryRow(ctx, walStats).Scan(&lsn1, &fpi1); err != nil {
		return st, err
	}
	ckpt1, err := b.checkpoints(ctx)
	if err != nil {
		return st, err
	}
	st.walBytes, st.checkpoints = lsn1-lsn0, ckpt1-ckpt0
	st.fpis = fpi1 - fpi0
	return st, nil
}

func (b *bench) checkpoints(ctx context.Context) (n int64, err error) {
	err = b.admin.QueryRow(ctx, `SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`).Scan(&n)
	return n, err
}

// oldClaim and oldClaimBatch are Process's and ClaimBatch's statements before
// migration 00003 (version 2), for the measurement before it.
const (
	oldClaim = `INSERT INTO processed_messages (consumer, message_id, expires_at) VALUES ($1, $2, now() + interval '172800000000 microseconds')
ON CONFLICT DO NOTHING`
	oldClaimBatch = `INSERT INTO processed_messages (consumer, message_id, expires_at)
SELECT $1, id, now() + interval '172800000000 microseconds' FROM unnest($2::text[]) WITH ORDINALITY AS u(id, n) ORDER BY n
ON CONFLICT DO NOTHING
RETURNING message_id`
)

// claim runs one operation of sc on t: at version 3 through the Store, at
// version 2 with the statements pgdedup sent then, pipelined the same way.
func (t *growthTable) claim(ctx context.Context, sc growthScenario) error {
	switch {
	case sc.key == "process" && t.version >= 3:
		id := newID()
		processed, err := t.store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error { return writeLedger(ctx, tx, id) })
		if err == nil && !processed {
			err = errSeenAsDuplicate
		}
		return err
	case sc.key == "process":
		id := newID()
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		b.Queue(oldClaim, consumer, id)
		br := t.pool.SendBatch(ctx, b)
		tx := br.Tx()
		defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
		_, err := br.Exec()
		if err == nil {
			tag, e := br.Exec()
			if err = e; err == nil && tag.RowsAffected() != 1 {
				err = errSeenAsDuplicate
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = writeLedger(ctx, tx, id)
		}
		if err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	ids := make([]string, sc.perOp)
	for i := range ids {
		ids[i] = newID()
	}
	return pgx.BeginFunc(ctx, t.pool, func(tx pgx.Tx) error {
		var n int
		if t.version >= 3 {
			fresh, err := t.store.ClaimBatch(ctx, tx, ids)
			if err != nil {
				return err
			}
			n = len(fresh)
		} else {
			slices.Sort(ids)
			rows, err := tx.Query(ctx, oldClaimBatch, consumer, ids)
			if err != nil {
				return err
			}
			if n, err = countRows(rows); err != nil {
				return err
			}
		}
		if n != len(ids) {
			return fmt.Errorf("claim batch: %d of %d new IDs claimed", n, len(ids))
		}
		return nil
	})
}

func countRows(rows pgx.Rows) (int, error) {
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	return n, rows.Err()
}

// growthTable returns the table of version v with rows rows, in schema
// pgdedup_growth_v<v>_<rows>. With keep, a complete table left by an earlier
// run is reused (loaded is false then); otherwise it is built.
func (b *bench) growthTable(ctx context.Context, v, rows int, keep bool) (t *growthTable, loaded bool, err error) {
	t = &growthTable{version: v, rows: rows, schema: fmt.Sprintf("pgdedup_growth_v%d_%d", v, rows)}
	if rows == 0 {
		t.schema = fmt.Sprintf("pgdedup_growth_v%d_empty_%s", v, b.nonce)
	}
	var complete bool
	if err := b.admin.QueryRow(ctx, `SELECT coalesce(obj_description(to_regnamespace($1), 'pg_namespace') = 'complete', false)`,
		t.schema).Scan(&complete); err != nil {
		return nil, false, err
	}
	if !(keep && complete && rows > 0) {
		if err := b.loadGrowthTable(ctx, t); err != nil {
			return nil, false, fmt.Errorf("growth: load %s: %w", t.schema, err)
		}
		loaded = true
	}
	if t.pool, err = b.schemaPool(ctx, t.schema, int32(slicesMax(b.cfg.workers))); err != nil {
		return nil, false, err
	}
	if v >= 3 {
		if t.store, err = pgdedup.New(t.pool, pgdedup.Config{Consumer: consumer, Retention: retention}); err != nil {
			return nil, false, err
		}
	}
	return t, loaded, nil
}

// loadGrowthTable creates t's schema, migrates it to t.version and loads
// t.rows rows: random UUID IDs, as brokers assign them, expiring in the order
// they were "claimed", all before the claims of the run.
//
// Load order decides index density. Inserting random keys one by one into a
// btree leaves its leaves about 70% full (each split leaves two half-full
// pages that fill up again), while CREATE INDEX after a bulk load packs them to its
// fillfactor (90% by default), an index that then splits on nearly every
// claim. So the heap is loaded first and the primary key built after with
// fillfactor 72: as dense as a table that grew claim by claim, at the speed
// of a sorted build. expires_at grows with time, so its index is append-only
// in production too and keeps the default 90%.
func (b *bench) loadGrowthTable(ctx context.Context, t *growthTable) error {
	conn, err := b.admin.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	exec := func(sql string, args ...any) error {
		_, err := conn.Exec(ctx, sql, args...)
		if err != nil {
			return fmt.Errorf("%s: %w", strings.SplitN(sql, "\n", 2)[0], err)
		}
		return nil
	}
	if err := exec(`DROP SCHEMA IF EXISTS ` + t.schema + ` CASCADE`); err != nil {
		return err
	}
	if err := exec(`CREATE SCHEMA ` + t.schema); err != nil {
		return err
	}
	pool, err := b.schemaPool(ctx, t.schema, 2)
	if err != nil {
		return err
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	p, err := pgdedup.NewMigrationProvider(sqlDB)
	if err == nil {
		_, err = p.UpTo(ctx, int64(t.version))
	}
	sqlDB.Close()
	pool.Close()
	if err != nil {
		return err
	}
	if err := exec(`SET search_path = ` + t.schema); err != nil {
		return err
	}
	if err := exec(`CREATE TABLE ledger (
    id         bigserial   PRIMARY KEY,
    message_id text        NOT NULL,
    amount     bigint      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	if t.rows > 0 {
		pkCols := "consumer, message_id"
		keyCol, keyExpr := "", ""
		if t.version >= 3 {
			pkCols, keyCol, keyExpr = "key", "key, ", "pgdedup_key($1, id), "
		}
		if err := exec(`ALTER TABLE processed_messages DROP CONSTRAINT processed_messages_pkey`); err != nil {
			return err
		}
		if err := exec(`DROP INDEX processed_messages_expires_at_idx`); err != nil {
			return err
		}
		const chunk = 1_000_000
		for lo := 1; lo <= t.rows; lo += chunk {
			hi := min(lo+chunk-1, t.rows)
			err := exec(`INSERT INTO processed_messages (`+keyCol+`consumer, message_id, processed_at, expires_at)
SELECT `+keyExpr+`$1, id, now() - interval '1 hour', now() + interval '47 hours' + g * interval '1 microsecond'
FROM (SELECT gen_random_uuid()::text AS id, g FROM generate_series($2::int, $3::int) g) s`, consumer, lo, hi)
			if err != nil {
				return err
			}
		}
		for _, sql := range []string{
			`SET maintenance_work_mem = '512MB'`,
			`CREATE UNIQUE INDEX processed_messages_pkey ON processed_messages (` + pkCols + `) WITH (fillfactor = 72)`,
			`ALTER TABLE processed_messages ADD CONSTRAINT processed_messages_pkey PRIMARY KEY USING INDEX processed_messages_pkey`,
			`ALTER INDEX processed_messages_pkey RESET (fillfactor)`,
			`CREATE INDEX processed_messages_expires_at_idx ON processed_messages (expires_at)`,
			`VACUUM (ANALYZE) processed_messages`,
		} {
			if err := exec(sql); err != nil {
				return err
			}
		}
	}
	if err := exec(`RESET search_path`); err != nil {
		return err
	}
	return exec(`COMMENT ON SCHEMA ` + t.schema + ` IS 'complete'`)
}

// schemaPool opens a pool of conns connections on schema.
func (b *bench) schemaPool(ctx context.Context, schema string, conns int32) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(b.cfg.databaseURL)
	if err != nil {
		return nil, err
	}
	pc.ConnConfig.RuntimeParams["search_path"] = schema
	pc.ConnConfig.RuntimeParams["application_name"] = "pgdedup-bench-growth"
	pc.MaxConns, pc.MinConns = conns, conns
	return pgxpool.NewWithConfig(ctx, pc)
}

func (t *growthTable) size(ctx context.Context, b *bench) (growthSize, error) {
	s := growthSize{version: t.version, rows: t.rows}
	tbl := t.schema + ".processed_messages"
	err := b.admin.QueryRow(ctx, `SELECT pg_relation_size($1::regclass), pg_table_size($1::regclass) - pg_relation_size($1::regclass),
(SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = $1::regclass)`, tbl).Scan(&s.heap, &s.toastEtc, &s.rowsAfter)
	if err != nil {
		return s, err
	}
	rows, err := b.admin.Query(ctx, `SELECT c.relname, pg_relation_size(c.oid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = $1::regclass ORDER BY i.indisprimary DESC, c.relname`, tbl)
	if err != nil {
		return s, err
	}
	for rows.Next() {
		var ix indexSize
		if err := rows.Scan(&ix.name, &ix.bytes); err != nil {
			return s, err
		}
		s.indexes = append(s.indexes, ix)
	}
	if err := rows.Err(); err != nil {
		return s, err
	}
	// pgstattuple (contrib) is optional: without it the density is not reported.
	var ext string
	_, _ = b.admin.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pgstattuple SCHEMA `+b.schema)
	if b.admin.QueryRow(ctx, `SELECT quote_ident(extnamespace::regnamespace::text) FROM pg_extension WHERE extname = 'pgstattuple'`).Scan(&ext) == nil {
		_ = b.admin.QueryRow(ctx, `SELECT avg_leaf_density FROM `+ext+`.pgstatindex($1)`, t.schema+".processed_messages_pkey").Scan(&s.avgLeafDensity)
	}
	return s, nil
}

func (t *growthTable) close(b *bench, keep bool) {
	if t.pool != nil {
		t.pool.Close()
	}
	if keep && t.rows > 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _ = b.admin.Exec(ctx, `DROP SCHEMA IF EXISTS `+t.schema+` CASCADE`)
}

// rowsLabel formats n as 20M or 100k when round, else with separators.
func rowsLabel(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1_000 && n%1_000 == 0:
		return fmt.Sprintf("%dk", n/1_000)
	}
	return count(float64(n))
}
