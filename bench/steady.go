package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgserver"
)

// steadyConfig is -only steady: Process at a fixed rate on a table that
// holds rate × Retention rows, at a Retention/checkpoint-cycle proportion of
// production's, side by side with the same run on an empty table (issue 18).
type steadyConfig struct {
	layout        string        // plain or partitioned
	partitions    int           // Config.Partitions for partitioned (0: the library's default)
	sentAt        bool          // every claim passes its first-sent time (WithSentAt), with SentAtMargin sentAtMargin()
	rate          int           // new messages per second
	cycle         time.Duration // the checkpoint cycle (checkpoint_timeout)
	ratio         int           // Retention = ratio × cycle
	cycles        int           // whole cycles measured
	warmup        int           // cycles run before the measured CHECKPOINT
	dupShare      float64       // redeliveries on top, as a share of rate
	cleanEach     time.Duration // RunCleaner's interval
	workers       int           // concurrent Process calls at the fixed rate
	poolConns     int           // the pool's MaxConns (0: enough for every worker and the cleaner)
	tputWorkers   int           // workers of the unthrottled phase
	tputFor       time.Duration // how long the unthrottled phase runs
	sharedBuffers string        // shared_buffers of the cluster
	tiny          bool          // the CI size; set by -steady-tiny
	ports         []int         // the cluster's port is the first free one
	command       string        // the command line, for the report
}

// retention is Config.Retention: ratio × cycle.
func (c steadyConfig) retention() time.Duration { return time.Duration(c.ratio) * c.cycle }

// sentAtMargin is the Stores' SentAtMargin with -steady-sent-at: the
// library's default (an hour) at the default Retention (48 h), compressed
// like the Retention: Retention ÷ 48.
func (c steadyConfig) sentAtMargin() time.Duration { return c.retention() / 48 }

// minCycles is the fewest cycles a steady window lasts by default.
const minCycles = 6

// wholeSpanCycles is -steady-cycles' default. On the plain layout it is
// minCycles. On the partitioned layout it is the fewest cycles that last
// a whole number of partition spans, and at least minCycles: the current
// partition's key index grows from empty over its span, and page images
// with it, so a window of part of a span reads low early in it and high
// late. Where a span is not a whole number of cycles, the cycles round up.
func (c steadyConfig) wholeSpanCycles() int {
	if c.layout != "partitioned" {
		return minCycles
	}
	n := c.partitions
	if n == 0 {
		n = pgdedup.DefaultPartitions
	}
	span := float64(c.ratio) / float64(n) // in cycles
	spans := math.Ceil(minCycles / span)
	return int(math.Ceil(spans*span - 1e-9))
}

// rows is what the full table holds: rate × Retention.
func (c steadyConfig) rows() int { return int(float64(c.rate) * c.retention().Seconds()) }

// serverCheckpoints says whether the server's checkpoint_timeout makes the
// cycle: it cannot be under 30 s, so a shorter (CI) cycle is made by the
// bench issuing CHECKPOINT every cycle.
func (c steadyConfig) serverCheckpoints() bool { return c.cycle >= 30*time.Second }

// naptime is autovacuum_naptime compressed like the cycle: production's
// default 1 min against a 15 min checkpoint cycle, 1 s at least.
func (c steadyConfig) naptime() time.Duration {
	return max(time.Second, (c.cycle / 15).Round(time.Second))
}

// pool is the pool's MaxConns: -steady-pool-conns, else one per worker of
// either phase and 2 more (the cleaner, the bench's own queries).
func (c steadyConfig) pool() int {
	if c.poolConns > 0 {
		return c.poolConns
	}
	return max(c.workers, c.tputWorkers) + 2
}

func (c steadyConfig) validate() error {
	switch {
	case c.layout != "plain" && c.layout != "partitioned":
		return fmt.Errorf("-layout must be plain or partitioned, got %q", c.layout)
	case c.partitions < 0 || c.partitions > 1000:
		return errors.New("-partitions must be from 0 (the library's default) to 1000")
	case c.rate < 1 || c.rate > 100_000:
		return errors.New("-steady-rate must be from 1 to 100000")
	case c.cycle < time.Second || c.cycle > 24*time.Hour:
		return errors.New("-steady-cycle must be from 1s to 24h")
	case c.ratio < 2 || c.ratio > 10_000:
		return errors.New("-steady-ratio must be from 2 to 10000")
	case c.cycles < 1 || c.warmup < 0:
		return errors.New("-steady-cycles must be at least 1, -steady-warmup not negative")
	case c.dupShare < 0 || c.dupShare > 1:
		return errors.New("-steady-dups must be from 0 to 1")
	case c.cleanEach <= 0 || c.cleanEach > c.retention():
		return errors.New("-steady-clean-every must be positive and at most the Retention")
	case c.workers < 1 || c.workers > 64 || c.tputWorkers < 1 || c.tputWorkers > 64:
		return errors.New("-steady-workers and -steady-tput-workers must be from 1 to 64")
	case c.poolConns < 0 || c.poolConns == 1 || c.poolConns > 66:
		return errors.New("-steady-pool-conns must be 0 (one per worker, and 2 more) or from 2 to 66")
	case c.tputFor < time.Second:
		return errors.New("-steady-tput-for must be at least 1s")
	case c.rows() > 1_000_000_000:
		return errors.New("-steady-rate × Retention is over 10⁹ rows")
	}
	return nil
}

// steadyRun is what one table's run measured.
type steadyRun struct {
	name      string
	preloaded int           // rows loaded before the run
	loadTook  time.Duration // how long the preload took, VACUUM and CHECKPOINT included

	rowsStart, rowsEnd int64 // count(*) at the start and end of the measured window
	window             time.Duration
	windowAt           time.Time // when the window began (wall clock)
	messages           int64     // new messages processed in the window
	deliveries         int64     // Process calls that ended in the window (redeliveries included)
	walBytes, fpi      int64     // pg_current_wal_lsn difference, pg_stat_wal.wal_fpi difference
	checkpoints        int64     // checkpoints that started in the window (timed and requested)
	p50, p99           time.Duration
	p99Queued          time.Duration // p99 from the message's entry into the workers' queue (wait, then Process)
	p99Warmup          time.Duration // p99 of the warm-up cycles, before the window (the first after the preload's CHECKPOINT)
	loadFrom, loadTo   string        // the machine's load average at the window's start and end
	phases             []phaseStat   // by part of the checkpoint cycle (steadyPhases)
	deadMax, deadEnd   int64         // n_dead_tup over the table's partitions, in the window
	deadSealedMax      int64         // of which in sealed partitions (partitioned): where retention works
	autovacuums        int64         // autovacuum runs on the table in the window
	deleted            int64         // rows the cleaner deleted in the window
	heap, indexes      int64         // bytes, at the end of the window
	tput               float64

	sent, dupsSent, dupped, processed, errors, cleanErr int64
	firstCleanErr                                       string // the first failed cleanup run's error
	retries                                             int64  // Process attempts rolled back and retried (EventRetry)
	ledgerRows, ledgerDistinct                          int64
}

func (r steadyRun) walPerMsg() float64 { return float64(r.walBytes) / float64(max(r.messages, 1)) }
func (r steadyRun) fpiPerMsg() float64 { return float64(r.fpi) / float64(max(r.messages, 1)) }

// steadyResult is the whole -only steady run.
type steadyResult struct {
	cfg                   steadyConfig
	start                 time.Time
	took                  time.Duration
	loadBefore, loadAfter string
	server                string // version
	settings              string
	empty, full           steadyRun
	tputRatios            []float64 // full ÷ empty, of each unthrottled round
	tputRatio             float64   // their median
	checks                []soakCheck
}

func (r steadyResult) passed() bool {
	for _, c := range r.checks {
		if !c.ok {
			return false
		}
	}
	return true
}

// runSteady starts a throwaway cluster with production settings on one of
// cfg.ports and runs the empty table, then the full one, each in a database
// of its own.
func runSteady(ctx context.Context, cfg steadyConfig, prog *progress) (steadyResult, error) {
	r := steadyResult{cfg: cfg, start: time.Now(), loadBefore: loadAverage()}
	checkpointTimeout := cfg.cycle
	if !cfg.serverCheckpoints() {
		checkpointTimeout = time.Hour // the bench makes the cycles
	}
	prog.step("steady: starting a throwaway cluster (fsync, full_page_writes, autovacuum on)")
	cluster, err := pgserver.StartClusterWith(pgserver.ClusterOptions{Ports: cfg.ports, Conf: fmt.Sprintf(`
fsync = on
full_page_writes = on
synchronous_commit = on
autovacuum = on
autovacuum_naptime = %dms
max_wal_size = 16GB
checkpoint_timeout = %ds
shared_buffers = '%s'
max_connections = 100
`, cfg.naptime().Milliseconds(), int(checkpointTimeout.Seconds()), cfg.sharedBuffers)})
	if err != nil {
		return r, err
	}
	defer cluster.Stop() //nolint:errcheck // best effort; its watchdog removes it otherwise

	admin, err := pgxpool.New(ctx, cluster.URL())
	if err != nil {
		return r, err
	}
	defer admin.Close()
	err = admin.QueryRow(ctx, `SELECT split_part(version(), ',', 1), string_agg(name || '=' || current_setting(name), ', ' ORDER BY name)
FROM pg_settings WHERE name IN ('fsync', 'full_page_writes', 'synchronous_commit', 'wal_compression', 'autovacuum', 'autovacuum_naptime',
'max_wal_size', 'checkpoint_timeout', 'checkpoint_completion_target', 'shared_buffers', 'wal_level', 'port')`).Scan(&r.server, &r.settings)
	if err != nil {
		return r, err
	}
	empty, err := startSteadyTable(ctx, cfg, cluster, admin, "empty", 0, prog)
	if err != nil {
		return r, fmt.Errorf("steady: empty table: %w", err)
	}
	defer empty.close()
	full, err := startSteadyTable(ctx, cfg, cluster, admin, "full", cfg.rows(), prog)
	if err != nil {
		return r, fmt.Errorf("steady: full table: %w", err)
	}
	defer full.close()
	if err := steadyThroughput(ctx, cfg, []*steadyTable{empty, full}, prog); err != nil {
		return r, err
	}
	for _, t := range []*steadyTable{empty, full} {
		if err := t.finish(ctx); err != nil {
			return r, fmt.Errorf("steady: %s table: %w", t.run.name, err)
		}
	}
	r.empty, r.full = empty.run, full.run
	for i := range min(len(empty.tputs), len(full.tputs)) {
		r.tputRatios = append(r.tputRatios, full.tputs[i]/max(empty.tputs[i], 1))
	}
	r.tputRatio = median(r.tputRatios)
	r.loadAfter = loadAverage()
	r.took = time.Since(r.start)
	r.judge()
	return r, nil
}

// steadyTable is one table's database, its Store and its cleaner.
type steadyTable struct {
	run           steadyRun
	db            string
	admin         *pgxpool.Pool
	pool          *pgxpool.Pool
	store         *pgdedup.Store
	cleanEa       time.Duration
	stopClean     func() // stops RunCleaner and waits for it
	cleanErr      atomic.Int64
	firstCleanErr atomic.Value // the first cleanup error, a string
	retries       atomic.Int64 // EventRetry: attempts rolled back and retried
	deleted       atomic.Int64
	tputSeq       atomic.Int64
	tputs         []float64 // messages/s of each unthrottled round
}

// startCleaner starts RunCleaner; stopClean stops it.
func (t *steadyTable) startCleaner(ctx context.Context) {
	ctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = t.store.RunCleaner(ctx, t.cleanEa) }()
	t.stopClean = func() { stop(); <-done }
}

// close stops the cleaner and drops the database.
func (t *steadyTable) close() {
	if t.stopClean != nil {
		t.stopClean()
		t.stopClean = nil
	}
	if t.pool != nil {
		t.pool.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _ = t.admin.Exec(ctx, `DROP DATABASE IF EXISTS `+t.db+` WITH (FORCE)`)
}

// finish stops the cleaner and counts the business rows of the fixed-rate
// phases (not the unthrottled rounds').
func (t *steadyTable) finish(ctx context.Context) error {
	if t.stopClean != nil {
		t.stopClean()
		t.stopClean = nil
	}
	t.run.cleanErr = t.cleanErr.Load()
	if e, ok := t.firstCleanErr.Load().(string); ok {
		t.run.firstCleanErr = e
	}
	t.run.tput = median(t.tputs)
	return t.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM soak_ledger WHERE message_id NOT LIKE 'tput-%'`).
		Scan(&t.run.ledgerRows, &t.run.ledgerDistinct)
}

// startSteadyTable creates the table in a fresh database, preloads it, and
// runs Process at the fixed rate with RunCleaner, measured over cfg.cycles
// whole cycles from a CHECKPOINT. The cleaner is stopped at the end of the
// window, so that this table writes nothing while the next one is measured.
func startSteadyTable(ctx context.Context, cfg steadyConfig, cluster *pgserver.Cluster, admin *pgxpool.Pool,
	name string, rows int, prog *progress) (t *steadyTable, err error) {
	t = &steadyTable{run: steadyRun{name: name, preloaded: rows}, db: "steady_" + name, admin: admin, cleanEa: cfg.cleanEach}
	r := &t.run
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+t.db); err != nil {
		return nil, err
	}
	self := t // t is nil once an error is returned
	defer func() {
		if err != nil {
			self.close()
		}
	}()
	url := strings.Replace(cluster.URL(), "/postgres?", "/"+t.db+"?", 1)
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = int32(cfg.pool())
	if t.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return nil, err
	}
	pool := t.pool
	if err := steadySchema(ctx, cfg, pool); err != nil {
		return nil, err
	}
	t0 := time.Now()
	if rows > 0 {
		prog.step("steady: %s: loading %d rows (rate × Retention, expiries spread over %s)", name, rows, cfg.retention())
		if err := preload(ctx, cfg, pool, rows, t0); err != nil {
			return nil, fmt.Errorf("preload: %w", err)
		}
	}
	for _, sql := range []string{`VACUUM (ANALYZE) processed_messages`, `CHECKPOINT`} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return nil, fmt.Errorf("%s: %w", sql, err)
		}
	}
	r.loadTook = time.Since(t0)

	t.store, err = pgdedup.New(pool, pgdedup.Config{Consumer: consumer, Retention: cfg.retention(),
		Layout: cfg.pgLayout(), Partitions: cfg.partitions, SentAtMargin: cfg.sentAtMargin(),
		OnEvent: func(_ context.Context, e pgdedup.Event) {
			if e.Kind == pgdedup.EventRetry {
				t.retries.Add(1)
			}
			if e.Kind != pgdedup.EventCleanup {
				return
			}
			t.deleted.Add(e.Count)
			// A run the bench's own stop cut short (RunCleaner's context
			// canceled at the end of a window) is not a failure, as
			// pgdedup logs it.
			if e.Err != nil && !errors.Is(e.Err, context.Canceled) && t.cleanErr.Add(1) == 1 {
				t.firstCleanErr.Store(e.Err.Error())
			}
		}})
	if err != nil {
		return nil, err
	}
	t.startCleaner(ctx)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	if !cfg.serverCheckpoints() {
		go func() {
			tick := time.NewTicker(cfg.cycle)
			defer tick.Stop()
			for {
				select {
				case <-runCtx.Done():
					return
				case <-tick.C:
					_, _ = admin.Exec(runCtx, `CHECKPOINT`)
				}
			}
		}()
	}

	l := &soakLoad{cfg: soakConfig{rate: cfg.rate, dupShare: cfg.dupShare, retention: cfg.retention(), workers: cfg.workers, sentAt: cfg.sentAt},
		store: t.store, start: time.Now()}
	if rows > 0 {
		l.preloaded = func() (string, time.Time, bool) { return preloadedID(rows, t0, cfg.retention()) }
	}
	sendCtx, stopSending := context.WithCancel(ctx)
	defer stopSending()
	loadDone := make(chan struct{})
	go func() { defer close(loadDone); l.run(sendCtx, ctx) }()

	prog.step("steady: %s: %d msg/s (+%.0f%% redeliveries), cleaner every %s, warm-up of %d cycles of %s",
		name, cfg.rate, 100*cfg.dupShare, cfg.cleanEach, cfg.warmup, cfg.cycle)
	if err := sleepCtx(ctx, time.Duration(cfg.warmup)*cfg.cycle); err != nil {
		return nil, err
	}

	// The measured window: whole cycles from a CHECKPOINT.
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return nil, err
	}
	before, err := steadySnapshot(ctx, pool, true)
	if err != nil {
		return nil, err
	}
	from := time.Since(l.start)
	r.windowAt = time.Now()
	r.loadFrom = loadAverage()
	msgs0, deleted0 := l.processed.Load(), t.deleted.Load()
	end := time.Now().Add(time.Duration(cfg.cycles) * cfg.cycle)
	for time.Now().Before(end) {
		if err := sleepCtx(ctx, min(5*time.Second, time.Until(end))); err != nil {
			return nil, err
		}
		s, err := steadySnapshot(ctx, pool, false)
		if err != nil {
			return nil, err
		}
		r.deadMax, r.deadSealedMax = max(r.deadMax, s.dead), max(r.deadSealedMax, s.deadSealed)
		prog.step("steady: %s: %s of %s: %d rows, %d dead tuples, %d msgs", name, (time.Since(l.start) - from).Round(time.Second),
			time.Duration(cfg.cycles)*cfg.cycle, s.live, s.dead, l.processed.Load()-msgs0)
	}
	after, err := steadySnapshot(ctx, pool, true)
	if err != nil {
		return nil, err
	}
	to := time.Since(l.start)
	r.loadTo = loadAverage()
	r.window = to - from
	r.messages, r.deleted = l.processed.Load()-msgs0, t.deleted.Load()-deleted0
	lats := l.latBetween(from, to)
	r.deliveries = int64(len(lats))
	r.p50, r.p99 = sample{lat: lats}.pct(0.5), sample{lat: lats}.pct(0.99)
	r.p99Queued = sample{lat: l.queuedBetween(from, to)}.pct(0.99)
	r.p99Warmup = sample{lat: l.latBetween(0, from)}.pct(0.99)
	r.phases = l.latPhases(from, to, cfg.cycle, steadyPhases)
	r.rowsStart, r.rowsEnd = before.rows, after.rows
	r.walBytes, r.fpi = after.lsn-before.lsn, after.fpi-before.fpi
	r.checkpoints = after.checkpoints - before.checkpoints
	r.deadEnd = after.dead
	r.deadMax, r.deadSealedMax = max(r.deadMax, after.dead), max(r.deadSealedMax, after.deadSealed)
	r.autovacuums = after.autovacuums - before.autovacuums
	r.heap, r.indexes = after.heap, after.indexes

	stopSending()
	<-loadDone
	t.stopClean()
	t.stopClean = nil
	r.sent, r.dupsSent, r.dupped, r.processed, r.errors = l.sent.Load(), l.dupsSent.Load(), l.dupped.Load(), l.processed.Load(), l.errors.Load()
	r.retries = t.retries.Load()
	return t, nil
}

// steadyRounds is how many rounds the unthrottled phase takes per table.
const steadyRounds = 4

// steadyThroughput measures each table's throughput with cfg.tputWorkers
// unthrottled, new IDs and its cleaner running, in interleaved rounds (the
// order rotating) so that a change in the machine's load falls on both.
func steadyThroughput(ctx context.Context, cfg steadyConfig, tables []*steadyTable, prog *progress) error {
	for _, t := range tables {
		// At once: the partitioned layout's partitions ahead ran out while
		// this table's cleaner was stopped.
		if _, err := t.store.Cleanup(ctx); err != nil {
			return fmt.Errorf("steady: %s table: %w", t.run.name, err)
		}
		t.startCleaner(ctx)
	}
	round := cfg.tputFor / steadyRounds
	for i := range steadyRounds {
		prog.step("steady: round %d of %d: %d workers unthrottled, %s per table", i+1, steadyRounds, cfg.tputWorkers, round)
		for j := range tables {
			t := tables[(i+j)%len(tables)]
			s, err := measure(ctx, cfg.tputWorkers, round, nil, func(ctx context.Context, _ int) error {
				id := fmt.Sprintf("tput-%09d-%08x", t.tputSeq.Add(1), rand.Uint32())
				processed, err := t.store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO soak_ledger (message_id, amount) VALUES ($1, 1)`, id)
					return err
				}, sentAtOpts(cfg.sentAt, time.Now())...)
				if err == nil && !processed {
					err = errSeenAsDuplicate
				}
				return err
			})
			if err != nil && !errors.Is(err, context.Canceled) {
				return fmt.Errorf("steady: %s table, unthrottled: %w", t.run.name, err)
			}
			t.tputs = append(t.tputs, s.perSec())
		}
	}
	return nil
}

// preloadPlain loads rows rows into the plain table as rate × Retention of
// claims would have left them: IDs pre-<n>, keys from pgdedup_key (the same
// as pgdedup.Key), expiries spread evenly over (t0, t0 + retention], so the
// cleaner deletes as many rows per second as the claims insert, and the heap
// in expiry order, as claims append it.
//
// As in the growth part, the primary key is built after the load with
// fillfactor 72: as dense as an index that grew claim by claim (measured 72%
// with pgstattuple), at the speed of a sorted build.
func preloadPlain(ctx context.Context, pool *pgxpool.Pool, rows int, t0 time.Time, retention time.Duration) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	step := retention.Seconds() / float64(rows)
	sqls := []string{
		`ALTER TABLE processed_messages DROP CONSTRAINT processed_messages_pkey`,
		`DROP INDEX processed_messages_expires_at_idx`,
	}
	const chunk = 500_000
	for lo := 1; lo <= rows; lo += chunk {
		sqls = append(sqls, fmt.Sprintf(`INSERT INTO processed_messages (key, consumer, message_id, processed_at, expires_at)
SELECT pgdedup_key($1, id), $1, id, e - $2::float8 * interval '1 second', e
FROM (SELECT 'pre-' || g AS id, $3::timestamptz + g * $4::float8 * interval '1 second' AS e
      FROM generate_series(%d, %d) g) s`, lo, min(lo+chunk-1, rows)))
	}
	sqls = append(sqls,
		`SET maintenance_work_mem = '512MB'`,
		`CREATE UNIQUE INDEX processed_messages_pkey ON processed_messages (key) WITH (fillfactor = 72)`,
		`ALTER TABLE processed_messages ADD CONSTRAINT processed_messages_pkey PRIMARY KEY USING INDEX processed_messages_pkey`,
		`ALTER INDEX processed_messages_pkey RESET (fillfactor)`,
		`CREATE INDEX processed_messages_expires_at_idx ON processed_messages (expires_at)`,
		`RESET maintenance_work_mem`,
	)
	for _, sql := range sqls {
		var args []any
		if strings.HasPrefix(sql, "INSERT") {
			args = []any{consumer, retention.Seconds(), t0, step}
		}
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			return fmt.Errorf("%s: %w", strings.SplitN(sql, "\n", 2)[0], err)
		}
	}
	return nil
}

// preloadedID picks a preloaded ID that expires between a quarter and all
// of the Retention from now: still a duplicate when redelivered. It gives
// the time the preload claimed it at (its processed_at), as its first-sent
// time.
func preloadedID(rows int, t0 time.Time, retention time.Duration) (string, time.Time, bool) {
	elapsed := time.Since(t0).Seconds() / retention.Seconds() // share of the rows expired by now
	lo := int(float64(rows)*(elapsed+0.25)) + 1
	if lo > rows {
		return "", time.Time{}, false
	}
	g := lo + rand.N(rows-lo+1)
	// preloadPlain and the partitioned preload: expires_at = t0 + g × step,
	// processed_at = expires_at − Retention.
	step := retention.Seconds() / float64(rows)
	claimed := t0.Add(time.Duration(float64(g)*step*float64(time.Second)) - retention)
	return fmt.Sprintf("pre-%d", g), claimed, true
}

// steadySnap is the cluster's and the table's state at one moment.
type steadySnap struct {
	lsn, fpi, checkpoints   int64
	rows                    int64 // count(*), when asked
	live, dead, autovacuums int64 // pg_stat_user_tables, summed over partitions
	deadSealed              int64 // dead, in the partitions before pgdedup_partitions.sealed
	heap, indexes           int64
}

// steadySnapshot reads s; count asks for an exact row count too.
func steadySnapshot(ctx context.Context, pool *pgxpool.Pool, count bool) (steadySnap, error) {
	var s steadySnap
	// The table and its partitions, if any (pg_indexes_size of a partitioned
	// table is 0: its partitions hold the indexes).
	err := pool.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - '0/0')::bigint, (SELECT wal_fpi FROM pg_stat_wal),
(SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter),
coalesce(sum(n_live_tup), 0)::bigint, coalesce(sum(n_dead_tup), 0)::bigint, coalesce(sum(autovacuum_count), 0)::bigint,
coalesce(sum(pg_table_size(relid)), 0)::bigint, coalesce(sum(pg_indexes_size(relid)), 0)::bigint
FROM pg_stat_user_tables WHERE relid IN (SELECT 'processed_messages'::regclass
    UNION ALL SELECT inhrelid FROM pg_inherits WHERE inhparent = 'processed_messages'::regclass)`).
		Scan(&s.lsn, &s.fpi, &s.checkpoints, &s.live, &s.dead, &s.autovacuums, &s.heap, &s.indexes)
	if err != nil {
		return s, fmt.Errorf("snapshot: %w", err)
	}
	err = pool.QueryRow(ctx, `SELECT coalesce(sum(s.n_dead_tup), 0)::bigint FROM pgdedup_partitions p
JOIN pg_inherits i ON i.inhparent = p.parent JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE p.parent = 'processed_messages'::regclass
AND (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz <= p.sealed`).Scan(&s.deadSealed)
	if err != nil && !strings.Contains(err.Error(), "42P01") { // no pgdedup_partitions: the plain layout
		return s, fmt.Errorf("snapshot: %w", err)
	}
	if count {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages`).Scan(&s.rows); err != nil {
			return s, fmt.Errorf("snapshot: %w", err)
		}
	}
	return s, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// judge fills in r.checks: exactness always; for the partitioned layout,
// no dead tuples left by retention.
func (r *steadyResult) judge() {
	add := func(key string, ok bool, format string, args ...any) {
		r.checks = append(r.checks, soakCheck{key, fmt.Sprintf(format, args...), ok})
	}
	for _, t := range []steadyRun{r.empty, r.full} {
		want := int64(float64(r.cfg.rate) * 0.95 * float64(time.Duration(r.cfg.warmup+r.cfg.cycles)*r.cfg.cycle) / float64(time.Second))
		add(t.name+" rate", t.sent >= want, "%s table: rate held: %d new messages sent, ≥ 95%% of rate × run time (%d)", t.name, t.sent, want)
		add(t.name+" errors", t.errors == 0 && t.cleanErr == 0, "%s table: no errors: %d Process, %d cleanup runs%s", t.name, t.errors, t.cleanErr, firstErr(t.firstCleanErr))
		add(t.name+" dups", t.dupped == t.dupsSent && t.processed == t.sent && t.ledgerRows == t.sent && t.ledgerDistinct == t.sent,
			"%s table: none lost, none doubled: %d new messages, %d processed, %d business rows (%d distinct); %d redeliveries sent, %d skipped",
			t.name, t.sent, t.processed, t.ledgerRows, t.ledgerDistinct, t.dupsSent, t.dupped)
	}
	if r.cfg.layout == "partitioned" {
		// Retention by DELETE leaves as many dead tuples as claims insert
		// (until vacuum); dropping partitions leaves none. Claims leave a few
		// in the partitions they write, which are then sealed (an attempt
		// rolled back, a speculative insert that lost a race): the bound is
		// 1% of the messages of the window, far below either.
		bound := r.full.messages / 100
		add("dead", r.full.deadSealedMax <= bound, "full table: no dead tuples left by retention (partitions dropped, no DELETE): "+
			"at most %d in the sealed partitions in the window, ≤ 1%% of its %d messages (a DELETE would leave 100%%); "+
			"%d claim attempts rolled back and retried; %d dead in all partitions",
			r.full.deadSealedMax, r.full.messages, r.full.retries, r.full.deadMax)
	}
}

// firstErr is ", the first: <err>" for a report line, or "" when err is "".
func firstErr(err string) string {
	if err == "" {
		return ""
	}
	return " (the first: " + err + ")"
}
