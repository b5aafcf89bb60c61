package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
)

// The claimcost part (-only claimcost) compares what one claim costs on the
// plain and the partitioned layouts, side by side in one process: the
// relation locks a claim holds (and how many miss PostgreSQL's 16 fast-path
// slots per backend), the planning and execution time of its statement
// (EXPLAIN ANALYZE), and Process throughput and latency in interleaved
// rounds. Each table is in a schema of its own in -database-url, empty or
// populated with -claimcost-rows rows spread over the Retention (one
// partition per span on the partitioned layout, as the steady part loads
// it). Variants of the partitioned layout try the ideas the claim cost was
// measured for: more or fewer partitions, the index on expires_at that
// partitions had before, and plan_cache_mode.

// claimCostConfig is the part's flags.
type claimCostConfig struct {
	partitions []int         // -claimcost-partitions
	rows       int           // -claimcost-rows
	rounds     int           // -claimcost-rounds
	round      time.Duration // -claimcost-round
	workers    int           // -claimcost-workers
	business   bool          // -claimcost-business-row: Process inserts one business row
	explains   int           // EXPLAIN ANALYZE runs per table
	// via is -claimcost-via: the rounds' pools connect through it (a
	// PgBouncer in transaction mode in front of the same database); the
	// set-up and the profile connect directly.
	via     string
	bouncer string // what -claimcost-via runs and how it is set, for the report
}

// claimRetention is every table's Retention: partitions of minutes, so that
// no partition switch falls in a short run (the rounds run Cleanup anyway).
const claimRetention = 4 * time.Hour

// claimVariant is one table the part measures.
type claimVariant struct {
	name       string
	partitions int  // 0: plain
	populated  bool // -claimcost-rows rows, else empty
	expIndex   bool // partitioned: partitions also have an index on expires_at, as before 0.x
	exec       bool // pgx's QueryExecModeExec (unnamed statements, planned on every claim, as through PgBouncer)
	sentAt     bool // each claim passes pgdedup.WithSentAt (see opts)
	// before: the time is just before the client's current partition began,
	// so that the claim's lower bound lies in the previous partition.
	before bool
}

// claimMargin is the partitioned tables' SentAtMargin: a message sent now
// is bound in the current partition (a fresh claim), one sent before it
// began in the previous one.
const claimMargin = time.Millisecond

// opts is the Options each claim of v passes: with a time, the message was
// created now, or (before) a millisecond before the current partition
// began.
func (v claimVariant) opts() []pgdedup.Option {
	if !v.sentAt {
		return nil
	}
	at := time.Now()
	if v.before {
		span := claimRetention / time.Duration(pgdedup.DefaultPartitions)
		at = at.Add(-spanOffset(at, span) - claimMargin)
	}
	return []pgdedup.Option{pgdedup.WithSentAt(at)}
}

// claimTracer keeps the last claim statement its pool sent (its SQL and
// arguments), for EXPLAIN: pg_stat_activity cuts long statements short.
type claimTracer struct {
	mu   sync.Mutex
	sql  string
	args []any
}

func (c *claimTracer) keep(sql string, args []any) {
	if strings.Contains(sql, "ON CONFLICT") && strings.HasPrefix(strings.TrimSpace(sql), "WITH") || strings.HasPrefix(sql, "INSERT INTO") {
		c.mu.Lock()
		c.sql, c.args = sql, args
		c.mu.Unlock()
	}
}

func (c *claimTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.keep(d.SQL, d.Args)
	return ctx
}
func (c *claimTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *claimTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (c *claimTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.keep(d.SQL, d.Args)
}
func (c *claimTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// claimTable is a variant set up: its pool and store.
type claimTable struct {
	claimVariant
	schema string
	tracer *claimTracer
	pc     *pgxpool.Config // its pools' configuration
	rounds *pgxpool.Config // the rounds' pools' (pc unless -claimcost-via)
	scfg   pgdedup.Config
	pool   *pgxpool.Pool // open while it is set up and profiled, and in each round
	store  *pgdedup.Store

	locks, slow    int     // relation locks held after one claim; those not fast-path
	planMS, execMS float64 // EXPLAIN ANALYZE medians, ms

	// Serial round trips on one connection (prepared, generic plans once
	// chosen), medians: the claim statement, its look-up alone, its insert
	// alone, and an empty statement (the round trip).
	claimRT, lookupRT, insertRT, emptyRT time.Duration
	partitionCount                       int // partitions attached

	generic, custom int64 // plans of the claim statement on one connection after the rounds (pg_prepared_statements)

	rate []float64       // claims/s per round, -claimcost-workers workers
	lat  []time.Duration // every Process call's latency, all rounds
}

func claimVariants(c claimCostConfig) []claimVariant {
	var vs []claimVariant
	for _, populated := range []bool{false, true} {
		state := "empty"
		if populated {
			state = "populated"
		}
		n := pgdedup.DefaultPartitions
		for _, exec := range []bool{false, true} {
			mode := ""
			if exec {
				mode = ", exec mode"
			}
			vs = append(vs, claimVariant{name: "plain " + state + mode, populated: populated, exec: exec})
			counts := c.partitions
			if populated && !slices.Contains(counts, n) {
				counts = append(slices.Clone(counts), n) // issue 29's ratios are of the default partitions
			}
			for _, m := range counts {
				if !exec || m == n {
					vs = append(vs, claimVariant{name: fmt.Sprintf("partitioned-%d %s%s", m, state, mode), partitions: m, populated: populated, exec: exec})
				}
			}
			vs = append(vs, claimVariant{name: fmt.Sprintf("partitioned-%d %s%s, with expires_at index", n, state, mode),
				partitions: n, populated: populated, exec: exec, expIndex: true})
			if populated {
				// Issue 29: a claim that knows the message's creation time
				// need look only in the partitions from it on.
				vs = append(vs, claimVariant{name: "plain populated" + mode + ", with a time", populated: true, exec: exec, sentAt: true},
					claimVariant{name: fmt.Sprintf("partitioned-%d populated%s, with a time", n, mode), partitions: n, populated: true, exec: exec, sentAt: true},
					claimVariant{name: fmt.Sprintf("partitioned-%d populated%s, sent before its partition", n, mode), partitions: n, populated: true, exec: exec, sentAt: true, before: true})
			}
		}
	}
	return vs
}

// claimCost runs the part and writes its report.
func claimCost(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	c := cfg.claimCost
	start, loadBefore := time.Now(), loadAverage()
	if c.via != "" { // before any work: a wrong URL fails at once
		var err error
		if c.bouncer, err = bouncerInfo(ctx, c.via); err != nil {
			return fmt.Errorf("claimcost: -claimcost-via: %w", err)
		}
	}
	nonce := randomHex(3)
	variants := claimVariants(c)
	prog := newProgress(stderr, len(variants)*(2+c.rounds))
	var tables []*claimTable
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(cctx, cfg.databaseURL)
		for _, t := range tables {
			t.close()
			if err == nil {
				_, _ = conn.Exec(cctx, "DROP SCHEMA IF EXISTS "+t.schema+" CASCADE")
			}
		}
		if err == nil {
			conn.Close(cctx)
		}
	}()
	var server string
	for i, v := range variants {
		t, err := setUpClaimTable(ctx, cfg.databaseURL, fmt.Sprintf("pgdedup_claimcost_%s_%d", nonce, i), v, c)
		if t != nil {
			tables = append(tables, t)
		}
		if err != nil {
			return fmt.Errorf("claimcost: %s: %w", v.name, err)
		}
		prog.step("set up %s", v.name)
		if server == "" {
			if err := t.pool.QueryRow(ctx, `SELECT version()`).Scan(&server); err != nil {
				return err
			}
		}
	}
	for _, t := range tables {
		err := t.profile(ctx, c.explains)
		t.close()
		if err != nil {
			return fmt.Errorf("claimcost: %s: profile: %w", t.name, err)
		}
		prog.step("profiled %s", t.name)
	}
	for r := range c.rounds {
		for i := range tables {
			t := tables[(i+r)%len(tables)]
			err := t.openWith(ctx, t.rounds)
			if err == nil {
				err = t.runRound(ctx, c)
			}
			if err == nil && r == c.rounds-1 && c.via == "" {
				err = t.pool.QueryRow(ctx, `SELECT coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0) FROM pg_prepared_statements
WHERE statement LIKE '%ON CONFLICT%'`).Scan(&t.generic, &t.custom)
			}
			t.close()
			if err != nil {
				return fmt.Errorf("claimcost: %s: %w", t.name, err)
			}
			prog.step("round %d: %s", r+1, t.name)
		}
	}
	prog.finish()
	md := claimCostMarkdown(cfg, c, tables, server, start, loadBefore)
	return write(cfg, stdout, md)
}

// setUpClaimTable makes v's schema, migrated, with the layout v asks for,
// populated or not, vacuumed and analyzed.
func setUpClaimTable(ctx context.Context, url, schema string, v claimVariant, c claimCostConfig) (*claimTable, error) {
	t := &claimTable{claimVariant: v, schema: schema, tracer: &claimTracer{}}
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+t.schema)
	admin.Close(ctx)
	if err != nil {
		return nil, err
	}
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pc.ConnConfig.RuntimeParams["search_path"] = t.schema
	pc.ConnConfig.RuntimeParams["application_name"] = "pgdedup-bench-claimcost"
	if v.exec {
		pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	pc.MaxConns = int32(c.workers + 1)
	pc.ConnConfig.Tracer = t.tracer
	t.pc, t.rounds = pc, pc
	if c.via != "" {
		// PgBouncer refuses search_path as a startup parameter: the store's
		// table and the ledger are qualified instead.
		if t.rounds, err = pgxpool.ParseConfig(c.via); err != nil {
			return t, err
		}
		t.rounds.ConnConfig.RuntimeParams["application_name"] = "pgdedup-bench-claimcost"
		t.rounds.ConnConfig.DefaultQueryExecMode = pc.ConnConfig.DefaultQueryExecMode
		t.rounds.MaxConns = pc.MaxConns
		t.rounds.ConnConfig.Tracer = t.tracer
	}
	t.scfg = pgdedup.Config{Consumer: consumer, Retention: claimRetention, Table: t.schema + ".processed_messages"}
	if v.partitions > 0 {
		t.scfg.Layout, t.scfg.Partitions = pgdedup.LayoutPartitioned, v.partitions
		t.scfg.SentAtMargin = claimMargin
	}
	if err := t.open(ctx); err != nil {
		return t, err
	}
	db := stdlib.OpenDBFromPool(t.pool)
	err = pgdedup.Migrate(ctx, db)
	db.Close()
	if err != nil {
		return t, err
	}
	if err := t.store.Setup(ctx); err != nil {
		return t, err
	}
	if _, err := t.pool.Exec(ctx, `CREATE TABLE claimcost_ledger (message_id text NOT NULL, amount bigint NOT NULL)`); err != nil {
		return t, err
	}
	if v.populated {
		if v.partitions > 0 {
			err = preloadPartitioned(ctx, t.pool, c.rows, time.Now(), claimRetention)
		} else {
			err = preloadPlain(ctx, t.pool, c.rows, time.Now(), claimRetention)
		}
		if err != nil {
			return t, err
		}
	}
	if _, err := t.store.Cleanup(ctx); err != nil {
		return t, err
	}
	if v.partitions > 0 {
		// The index on expires_at: added where the variant has it, dropped
		// where it has not (preloadPartitioned makes it as partitions were
		// made before).
		rows, err := t.pool.Query(ctx, `SELECT quote_ident(c.relname::text) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'processed_messages'::regclass ORDER BY 1`)
		if err != nil {
			return t, err
		}
		parts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return t, err
		}
		t.partitionCount = len(parts)
		for _, p := range parts {
			idx := strings.Trim(p, `"`) + "_exp"
			sql := `DROP INDEX IF EXISTS ` + pgx.Identifier{t.schema, idx}.Sanitize()
			if v.expIndex {
				sql = `CREATE INDEX IF NOT EXISTS ` + pgx.Identifier{idx}.Sanitize() + ` ON ` + p + ` (expires_at)`
			}
			if _, err := t.pool.Exec(ctx, sql); err != nil {
				return t, err
			}
		}
	}
	_, err = t.pool.Exec(ctx, `VACUUM ANALYZE processed_messages`)
	return t, err
}

// open opens t's pool and store.
func (t *claimTable) open(ctx context.Context) error { return t.openWith(ctx, t.pc) }

// openWith opens t's pool with pc, and its store.
func (t *claimTable) openWith(ctx context.Context, pc *pgxpool.Config) error {
	var err error
	if t.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return err
	}
	t.store, err = pgdedup.New(t.pool, t.scfg)
	return err
}

// close closes t's pool, if open.
func (t *claimTable) close() {
	if t.pool != nil {
		t.pool.Close()
		t.pool = nil
	}
}

// profile counts the relation locks one claim holds (seen from another
// session while its transaction is open) and takes the median planning and
// execution time of its statement under EXPLAIN ANALYZE (rolled back).
func (t *claimTable) profile(ctx context.Context, explains int) error {
	conn, err := t.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return err
	}
	const warm = 8 // the last claim counts: the connection's caches are warm, and the plan cache has chosen (after 5 custom plans)
	for i := range warm {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := t.store.Claim(ctx, tx, newID(), t.opts()...); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if i < warm-1 {
			if err := tx.Rollback(ctx); err != nil {
				return err
			}
			continue
		}
		err = t.pool.QueryRow(ctx, `SELECT
(SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'relation'),
(SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'relation' AND NOT l.fastpath)
FROM pg_stat_activity a WHERE a.pid = $1`, pid).Scan(&t.locks, &t.slow)
		if rerr := tx.Rollback(ctx); err == nil {
			err = rerr
		}
		if err != nil {
			return err
		}
	}
	t.tracer.mu.Lock()
	sql, claimArgs := t.tracer.sql, t.tracer.args
	t.tracer.mu.Unlock()
	if len(claimArgs) < 3 {
		return fmt.Errorf("the claim statement takes %d parameters; the bench passes the consumer, the ID and its key first", len(claimArgs))
	}
	var plans, execs []float64
	for range explains {
		// A new ID and its key; any further parameter (a claim with a
		// time) as the store sent it.
		id := newID()
		args := slices.Clone(claimArgs)
		args[0], args[1], args[2] = consumer, id, pgdedup.Key(consumer, id)
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		var out []byte
		err = tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+sql, args...).Scan(&out)
		_ = tx.Rollback(ctx)
		if err != nil {
			return err
		}
		var ex []struct {
			Planning  float64 `json:"Planning Time"`
			Execution float64 `json:"Execution Time"`
		}
		if err := json.Unmarshal(out, &ex); err != nil || len(ex) != 1 {
			return fmt.Errorf("EXPLAIN output: %v", err)
		}
		plans, execs = append(plans, ex[0].Planning), append(execs, ex[0].Execution)
	}
	t.planMS, t.execMS = median(plans), median(execs)
	if t.exec {
		return nil // the statement times are pgx's default mode's
	}
	return t.parts(ctx, conn.Conn(), sql, claimArgs, explains*8)
}

// parts times the claim statement and its parts, each alone in a
// transaction rolled back, n times each, interleaved, on one connection.
// claimArgs are the parameters the store sent with claimSQL: the consumer,
// the ID and its key, then any others, which are kept.
func (t *claimTable) parts(ctx context.Context, conn *pgx.Conn, claimSQL string, claimArgs []any, n int) error {
	lookup := `SELECT EXISTS (SELECT FROM processed_messages x WHERE x.key = $1::uuid)`
	insert := `INSERT INTO processed_messages (key, consumer, message_id, processed_at, expires_at)
VALUES ($1::uuid, $2, $3, now(), now() + interval '1 hour') ON CONFLICT DO NOTHING`
	if t.partitions > 0 {
		// As the claim looks up the sealed partitions, and inserts into the
		// current one (the parent routes the row by processed_at).
		lookup = `SELECT EXISTS (SELECT FROM processed_messages x WHERE x.key = $1::uuid
AND x.processed_at < (SELECT sealed FROM pgdedup_partitions WHERE parent = 'processed_messages'::regclass))`
		insert = strings.Replace(insert, "now(), now()", "clock_timestamp(), now()", 1)
	}
	stmts := []struct {
		sql  string
		args func(id string) []any
		out  *time.Duration
	}{
		{claimSQL, func(id string) []any {
			return append([]any{consumer, id, pgdedup.Key(consumer, id)}, claimArgs[3:]...)
		}, &t.claimRT},
		{lookup, func(id string) []any { return []any{pgdedup.Key(consumer, id)} }, &t.lookupRT},
		{insert, func(id string) []any { return []any{pgdedup.Key(consumer, id), consumer, id} }, &t.insertRT},
		{`SELECT`, func(string) []any { return nil }, &t.emptyRT},
	}
	took := make([][]float64, len(stmts))
	for range n {
		for i, st := range stmts {
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			s := time.Now()
			_, err = tx.Exec(ctx, st.sql, st.args(newID())...)
			took[i] = append(took[i], float64(time.Since(s)))
			if rerr := tx.Rollback(ctx); err == nil {
				err = rerr
			}
			if err != nil {
				return fmt.Errorf("%s: %w", strings.SplitN(st.sql, "\n", 2)[0], err)
			}
		}
	}
	for i, st := range stmts {
		*st.out = time.Duration(median(took[i]))
	}
	return nil
}

// runRound runs Process for new IDs (an empty fn: the claim and its
// transaction only, or one business row with -claimcost-business-row; WithSentAt(time.Now()) for a variant with a time) on
// workers connections for one round, after a Cleanup that seals any
// partition the clock has left.
func (t *claimTable) runRound(ctx context.Context, c claimCostConfig) error {
	if _, err := t.store.Cleanup(ctx); err != nil {
		return err
	}
	var n atomic.Int64
	var mu sync.Mutex
	var firstErr error
	deadline := time.Now().Add(c.round)
	var wg sync.WaitGroup
	lats := make([][]time.Duration, c.workers)
	begin := time.Now()
	for w := range c.workers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				s := time.Now()
				id := newID()
				_, err := t.store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
					if !c.business {
						return nil
					}
					_, err := tx.Exec(ctx, `INSERT INTO `+t.schema+`.claimcost_ledger (message_id, amount) VALUES ($1, 1)`, id)
					return err
				}, t.opts()...)
				if err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					return
				}
				lats[w] = append(lats[w], time.Since(s))
				n.Add(1)
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	t.rate = append(t.rate, float64(n.Load())/time.Since(begin).Seconds())
	for _, l := range lats {
		t.lat = append(t.lat, l...)
	}
	return nil
}

// plainTwin is the plain table in t's state and exec mode, with a time or
// not (sentAt); nil when the run has none.
func plainTwin(tables []*claimTable, t *claimTable, sentAt bool) *claimTable {
	for _, u := range tables {
		if u.partitions == 0 && u.populated == t.populated && u.exec == t.exec && u.sentAt == sentAt && !u.before {
			return u
		}
	}
	return nil
}

// rateRatio is t's rate as a share of base's: the median of the rounds'
// ratios (each round runs both tables, so a change in the machine's load
// falls on both). It is 0 when base is nil or ran no round.
func rateRatio(t, base *claimTable) float64 {
	if base == nil {
		return 0
	}
	var ratios []float64
	for i := range t.rate {
		if i < len(base.rate) && base.rate[i] > 0 {
			ratios = append(ratios, t.rate[i]/base.rate[i])
		}
	}
	if len(ratios) == 0 {
		return 0
	}
	return median(ratios)
}

// claimCostTargets writes the ratios issue 29's done-when names: on the
// populated tables, the partitioned table's claims with a time against the
// plain table's (≥ 0.95× prepared, ≥ 0.85× exec mode), and without a time
// (no worse than 0.75×, the figure before bounded claims). With a time, the
// target is for the mix of a message claimed promptly at the defaults:
// bound in the current partition 3 claims in 4 (4 h spans, SentAtMargin
// 1 h), in the previous one the fourth.
func claimCostTargets(p func(string, ...any), tables []*claimTable) {
	find := func(sentAt, before, exec bool) *claimTable {
		for _, t := range tables {
			if t.partitions == pgdedup.DefaultPartitions && t.populated && !t.expIndex && t.exec == exec && t.sentAt == sentAt && t.before == before {
				return t
			}
		}
		return nil
	}
	var rows []string
	row := func(name string, r, without, want float64) {
		w, verdict := "–", ""
		if want > 0 {
			w = fmt.Sprintf("≥ %.2f×", want)
			verdict = map[bool]string{true: " (met)", false: " (not met)"}[r >= want]
		}
		rows = append(rows, fmt.Sprintf("| %s | %.2f×%s | %.2f× | %s |\n", name, r, verdict, without, w))
	}
	for _, exec := range []bool{false, true} {
		mode, want := "", 0.95
		if exec {
			mode, want = ", exec mode", 0.85
		}
		fresh, before := find(true, false, exec), find(true, true, exec)
		if fresh == nil || before == nil {
			continue
		}
		same, without := plainTwin(tables, fresh, true), plainTwin(tables, fresh, false)
		for _, t := range []*claimTable{fresh, before} {
			row(t.name, rateRatio(t, same), rateRatio(t, without), 0)
		}
		mix := func(base *claimTable) float64 {
			f, b := rateRatio(fresh, base), rateRatio(before, base)
			if f == 0 || b == 0 {
				return 0
			}
			return 1 / (0.75/f + 0.25/b)
		}
		row(fmt.Sprintf("partitioned-%d populated%s, with a time, at the defaults (3 in 4 fresh)", pgdedup.DefaultPartitions, mode), mix(same), mix(without), want)
	}
	for _, exec := range []bool{false, true} {
		if t := find(false, false, exec); t != nil {
			want := 0.75
			if exec {
				want = 0
			}
			row(t.name, rateRatio(t, plainTwin(tables, t, false)), rateRatio(t, plainTwin(tables, t, false)), want)
		}
	}
	if len(rows) == 0 {
		return
	}
	p("\nIssue 29's ratios, populated tables: the partitioned table's claims as a share of the plain table's in the same " +
		"exec mode, each plain claim with a time or not as the partitioned one (and against the plain claim without a time). " +
		"With a time, the target is for the mix at the defaults: a message claimed promptly is bound in the current partition " +
		"3 claims in 4 (4 h spans, `SentAtMargin` 1 h), in the previous one the fourth; the mix's rate is the harmonic one:\n\n")
	p("| partitioned table | ÷ plain, same call | ÷ plain without a time | target |\n|---|--:|--:|--:|\n")
	for _, r := range rows {
		p("%s", r)
	}
}

func latencyAt(lat []time.Duration, q float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// claimCostMarkdown is the part's results file.
func claimCostMarkdown(cfg config, c claimCostConfig, tables []*claimTable, server string, start time.Time, loadBefore string) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	loadAfter := loadAverage()
	p("## What a claim costs, plain and partitioned\n\n")
	p("- Command: `%s`\n", commandLine(cfg.args))
	p("- Date: %s UTC, took %s\n", start.UTC().Format("2006-01-02 15:04"), time.Since(start).Round(time.Second))
	p("- Machine: %d cores (%s), %s RAM, load average (1, 5, 15 min) %s at the start, %s at the end; "+
		"the bench and the server share it, with other work. %s\n", runtime.NumCPU(), cpuModel(), memTotal(), loadBefore, loadAfter, busy(loadBefore, loadAfter))
	p("- PostgreSQL: %s, the -database-url server as it is configured\n", strings.SplitN(server, ",", 2)[0])
	p("- Tables: one schema each; Retention %s; populated: %s rows with claim times spread over the Retention "+
		"(partitioned: one partition per span, as the steady part loads them), then `VACUUM ANALYZE`; "+
		"`Cleanup` makes the partitions ahead and seals the past ones\n", claimRetention, count(float64(c.rows)))
	p("- Locks: the relation locks (tables and indexes) a backend holds after a claim in an open transaction (pg_locks, seen " +
		"from another session; the connection's 8th claim, once the plan cache has chosen a plan), and how many of them missed the 16 fast-path slots a backend has and went through the shared lock manager\n")
	p("- Plan, execution: medians of %d `EXPLAIN (ANALYZE)` runs of the claim statement for a new ID, rolled back "+
		"(a custom plan, as in exec mode; pgx's default mode reuses a generic plan)\n", c.explains)
	p("- Statement times: medians of %d runs each on one connection, interleaved, each alone in a transaction rolled back, "+
		"as the client sees them (round trip included): the claim statement; its look-up alone (`SELECT EXISTS` of the key, "+
		"in the sealed partitions on the partitioned layout); its insert alone (`INSERT … ON CONFLICT DO NOTHING` of the key, "+
		"into the parent, which routes it to the current partition); an empty statement (`SELECT`: the round trip)\n", c.explains*8)
	fn := "an empty function (the claim and its transaction)"
	if c.business {
		fn = "one business row (an `INSERT` into a table of its own in the claim's transaction)"
	}
	p("- Throughput: `Store.Process` with %s for new IDs, %d workers, "+
		"%d interleaved rounds of %s per table (the order rotating); the median round, and as a ratio to the plain table "+
		"in the same state and exec mode (the median of the rounds' ratios); latency over all rounds. Exec mode: pgx's `QueryExecModeExec` (unnamed statements, "+
		"planned on every execution, as `default_query_exec_mode=exec` behind PgBouncer). Plans: generic and custom plans of the "+
		"claim statement on one connection of the table's pool after the rounds (pg_prepared_statements; pgx prepares and caches it)\n", fn, c.workers, c.rounds, c.round)
	if c.via != "" {
		p("- Through PgBouncer: the rounds' pools connect through `%s` (%s); the set-up, the locks, the plans and the statement times "+
			"connect directly. Its server connections serve every table's pool, so the plans column is left out\n", c.via, c.bouncer)
	}
	p("\n")
	p("With a time: each claim passes `pgdedup.WithSentAt`, with `SentAtMargin` %s on the partitioned tables: \"with a time\" is a message created now, "+
		"so its claim is bound in the current partition (a fresh claim, one `INSERT`); \"sent before its partition\" is one created %s before the current "+
		"partition began, bound in the previous one, which is sealed (a look-up there, then the insert). Their ÷ plain is against the plain table's claims with a time.\n\n", claimMargin, claimMargin)
	p("| table | partitions attached | relation locks per claim | not fast-path | plan (EXPLAIN) | execution | plans generic, custom | msgs/s | ÷ plain | p50 | p99 |\n")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, t := range tables {
		base := plainTwin(tables, t, t.sentAt)
		parts := "–"
		if t.partitions > 0 {
			parts = strconv.Itoa(t.partitionCount)
		}
		plans := fmt.Sprintf("%d, %d", t.generic, t.custom)
		if c.via != "" {
			plans = "–"
		}
		p("| %s | %s | %d | %d | %.3f ms | %.3f ms | %s | %s | %.2f× | %s ms | %s ms |\n", t.name, parts, t.locks, t.slow, t.planMS, t.execMS,
			plans, count(median(t.rate)), rateRatio(t, base), ms(latencyAt(t.lat, 0.5)), ms(latencyAt(t.lat, 0.99)))
	}
	claimCostTargets(p, tables)
	p("\n| table | claim statement | its look-up alone | its insert alone | empty statement (round trip) |\n|---|--:|--:|--:|--:|\n")
	for _, t := range tables {
		if !t.exec {
			p("| %s | %s ms | %s ms | %s ms | %s ms |\n", t.name, ms(t.claimRT), ms(t.lookupRT), ms(t.insertRT), ms(t.emptyRT))
		}
	}
	return b.String()
}

// bouncerInfo is the version and the pooling settings of the PgBouncer at
// url, read from its admin console (the database pgbouncer).
func bouncerInfo(ctx context.Context, url string) (string, error) {
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		return "", err
	}
	cc.Database = "pgbouncer"
	cc.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var version string
	if err := conn.QueryRow(ctx, `SHOW VERSION`).Scan(&version); err != nil {
		return "", err
	}
	rows, err := conn.Query(ctx, `SHOW CONFIG`)
	if err != nil {
		return "", err
	}
	settings := map[string]string{}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return "", err
		}
		if len(vals) >= 2 {
			settings[fmt.Sprint(vals[0])] = fmt.Sprint(vals[1])
		}
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s, pool_mode %s, max_prepared_statements %s, default_pool_size %s",
		version, settings["pool_mode"], cmp.Or(settings["max_prepared_statements"], "– (before 1.21)"), settings["default_pool_size"]), nil
}
