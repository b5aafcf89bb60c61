// Command bench measures pgdedup side by side with the bare business
// transaction and the Redis SET NX recipe, on one machine, in one process,
// and prints the results as markdown, opened by a header that names the
// command, the machine, the PostgreSQL version and the date.
//
// From the repository root (-o is relative to bench/):
//
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable go run -C bench . -o results/bench.md
//
// The parts (-only): accounting counts round trips on the wire and WAL bytes
// per message; messages and delayed (+250µs each way through a proxy) run the
// bare business transaction, a hand-written pgx pipeline of Process's SQL,
// Process, Claim, the Redis SET NX recipe and the duplicate path in
// interleaved rounds, so drift of a shared machine hits all alike; batch runs
// ClaimBatch; cleanup deletes expired rows with Process alongside. Only when
// named: soak (a throwaway cluster at a fixed rate with RunCleaner), citus
// (a Citus coordinator, -citus-url), growth (a table of millions of rows),
// steady (production proportions), claimcost (one claim, plain and
// partitioned) and forget (the time to forget expired IDs, both layouts).
//
// It works in a schema of its own, created and dropped, and under Redis keys
// of its own, deleted at the end.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// config is the command line.
type config struct {
	databaseURL     string
	citusURL        string
	citusShards     int
	citusColumn     string
	redisAddr       string
	workers         []int
	rounds          int
	round           time.Duration
	delay           time.Duration
	cleanupRows     int
	cleanupBaseline time.Duration
	cleanupBatch    int
	only            []string
	out             string
	cpuProfile      string
	sizingDoc       string   // -sizing-doc: rewrite that file's generated table and measure nothing
	args            []string // the command line, for the report's header

	soak   soakConfig   // -only soak
	growth growthConfig // -only growth
	steady steadyConfig // -only steady

	claimCost  claimCostConfig // -only claimcost
	forgetRows []int           // -only forget: -forget-rows

	accountMessages int // messages per repetition when counting round trips and WAL
	accountReps     int // repetitions; the WAL figure is the smallest
}

// parts are the parts of a run, for -only, in the order they run.
var parts = []string{"accounting", "messages", "delayed", "batch", "cleanup"}

// optionalParts run only when -only names them: the soak takes minutes and
// starts a cluster of its own; citus needs a Citus cluster (-citus-url);
// growth loads a table of millions of rows; steady (alone) starts a cluster
// of its own and loads rate × Retention rows.
var optionalParts = []string{"soak", "citus", "growth", "steady", "claimcost", "forget"}

func (c config) runs(part string) bool { return slices.Contains(c.only, part) }

func parseFlags(args []string, stderr io.Writer) (config, error) {
	c := config{accountMessages: 200, accountReps: 5, args: redactArgs(args)}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.databaseURL, "database-url", cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@localhost:5432/postgres?sslmode=disable"),
		"Postgres to measure (default $DATABASE_URL, else the docker-compose database)")
	fs.StringVar(&c.citusURL, "citus-url", cmp.Or(os.Getenv("CITUS_URL"), "postgres://postgres@127.0.0.1:9700/postgres?sslmode=disable"),
		"Citus coordinator for -only citus (default $CITUS_URL, else the test cluster of .ci/citus.sh)")
	fs.StringVar(&c.citusColumn, "citus-column", "message_id", "for -only citus: the distribution column of processed_messages and the ledger, message_id or key")
	fs.IntVar(&c.citusShards, "citus-shards", 0, "shards per table for -only citus (0: the cluster's citus.shard_count, 32 by default)")
	fs.StringVar(&c.redisAddr, "redis", cmp.Or(os.Getenv("REDIS_ADDR"), "127.0.0.1:6379"), "Redis address for the SET NX recipe (default $REDIS_ADDR)")
	workers := fs.String("workers", "1,8", "comma-separated worker counts (concurrent messages)")
	fs.IntVar(&c.rounds, "rounds", 20, "interleaved rounds; results are medians over rounds")
	fs.DurationVar(&c.round, "round", 350*time.Millisecond, "how long each scenario runs in each round")
	fs.DurationVar(&c.delay, "delay", 250*time.Microsecond, "one-way delay the proxy adds for the delayed table; 0 skips it")
	fs.IntVar(&c.cleanupRows, "cleanup-rows", 1_000_000, "expired rows Cleanup deletes")
	fs.IntVar(&c.cleanupBatch, "cleanup-batch", 0, "Config.CleanupBatchSize for Cleanup (0: the library default)")
	fs.DurationVar(&c.cleanupBaseline, "cleanup-baseline", 3*time.Second, "how long Process runs alone before Cleanup, for its p99 without cleanup")
	only := fs.String("only", strings.Join(parts, ","), "comma-separated parts to run: "+strings.Join(parts, ", ")+
		"; and, only when named, "+strings.Join(optionalParts, ", "))
	fs.DurationVar(&c.soak.duration, "soak-duration", 2*time.Minute, "soak: how long messages are sent")
	fs.IntVar(&c.soak.rate, "soak-rate", 200, "soak: new messages per second")
	fs.Float64Var(&c.soak.dupShare, "soak-dups", 0.2, "soak: redeliveries sent on top of the new messages, as a share of them")
	fs.DurationVar(&c.soak.retention, "soak-retention", 30*time.Second, "soak: the Store's Retention")
	fs.DurationVar(&c.soak.cleanEach, "soak-clean-every", 3*time.Second, "soak: RunCleaner's interval")
	fs.IntVar(&c.soak.workers, "soak-workers", 4, "soak: concurrent Process calls")
	fs.DurationVar(&c.soak.naptime, "soak-naptime", time.Second, "soak: autovacuum_naptime of the soak's cluster")
	tableAV := fs.String("soak-table-autovacuum", "", "soak: comma-separated autovacuum_* storage parameters set on processed_messages, "+
		"e.g. autovacuum_vacuum_scale_factor=0.01,autovacuum_vacuum_threshold=1000 (empty: the server's defaults)")
	fs.IntVar(&c.growth.rows, "growth-rows", 20_000_000, "growth: rows of the big table")
	versions := fs.String("growth-versions", "2,3", "growth: schema versions to measure (2: before migration 00003, 3: now)")
	fs.DurationVar(&c.growth.steady, "growth-steady", 0, "growth: then Process on each big table alone this long, from a CHECKPOINT, for WAL across checkpoints (0 skips)")
	fs.BoolVar(&c.growth.keep, "growth-keep", false, "growth: keep the big tables (schema pgdedup_growth_v<version>_<rows>) and reuse them next time")
	fs.StringVar(&c.steady.layout, "layout", "plain", "steady: the table layout, plain or partitioned")
	fs.IntVar(&c.steady.partitions, "partitions", 0, "steady, -layout partitioned: partitions per Retention (Config.Partitions; 0: the library's default)")
	fs.BoolVar(&c.steady.sentAt, "steady-sent-at", false, "steady: every claim passes its message's first-sent time (WithSentAt), with SentAtMargin = Retention ÷ 48 (the default hour at 48 h)")
	fs.IntVar(&c.steady.rate, "steady-rate", 800, "steady: new messages per second")
	fs.DurationVar(&c.steady.cycle, "steady-cycle", 30*time.Second, "steady: the checkpoint cycle (checkpoint_timeout; under 30s the bench issues CHECKPOINT)")
	fs.IntVar(&c.steady.ratio, "steady-ratio", 192, "steady: R, Retention = R × cycle (192: 48 h with 15 min checkpoints)")
	fs.IntVar(&c.steady.cycles, "steady-cycles", 0, "steady: whole cycles measured (0: 6 on the plain layout; on the partitioned one, "+
		"the fewest that make whole partition spans and at least 6, so WAL and p99 weigh every moment of a span alike: 16 at 12 partitions)")
	fs.IntVar(&c.steady.warmup, "steady-warmup", 1, "steady: cycles run before the measured CHECKPOINT")
	fs.Float64Var(&c.steady.dupShare, "steady-dups", 0.1, "steady: redeliveries on top of the new messages, as a share of them")
	fs.DurationVar(&c.steady.cleanEach, "steady-clean-every", 5*time.Second, "steady: RunCleaner's interval")
	fs.IntVar(&c.steady.workers, "steady-workers", 8, "steady: concurrent Process calls at the fixed rate")
	fs.IntVar(&c.steady.poolConns, "steady-pool-conns", 0, "steady: the pool's MaxConns, shared by the workers and the cleaner (0: one per worker and 2 more; "+
		"pgxpool's own default is the larger of 4 and the CPUs, so fewer connections than workers queue the calls inside Process)")
	fs.IntVar(&c.steady.tputWorkers, "steady-tput-workers", 8, "steady: workers of the unthrottled throughput phase")
	fs.DurationVar(&c.steady.tputFor, "steady-tput-for", 20*time.Second, "steady: how long the unthrottled phase runs")
	fs.StringVar(&c.steady.sharedBuffers, "steady-shared-buffers", "1GB", "steady: shared_buffers of the cluster")
	fs.BoolVar(&c.steady.tiny, "steady-tiny", false, "steady: the CI size (rate 100, R 8, cycle 5s, 2 cycles, < 90 s) unless set otherwise")
	forgetRows := fs.String("forget-rows", "10000,100000,1000000", "forget: comma-separated counts of expired IDs to forget")
	claimParts := fs.String("claimcost-partitions", "4,6,12,24", "claimcost: comma-separated partition counts of the partitioned tables")
	fs.IntVar(&c.claimCost.rows, "claimcost-rows", 200_000, "claimcost: rows of the populated tables")
	fs.IntVar(&c.claimCost.rounds, "claimcost-rounds", 3, "claimcost: interleaved rounds")
	fs.DurationVar(&c.claimCost.round, "claimcost-round", 2*time.Second, "claimcost: how long each table runs in each round")
	fs.IntVar(&c.claimCost.workers, "claimcost-workers", 8, "claimcost: concurrent Process calls")
	fs.BoolVar(&c.claimCost.business, "claimcost-business-row", false, "claimcost: Process inserts one business row in the claim's transaction (issue 29's measure), instead of nothing")
	fs.StringVar(&c.claimCost.via, "claimcost-via", "", "claimcost: a URL of the same database through PgBouncer (transaction mode): the throughput rounds connect through it, the set-up and the profile directly")
	fs.StringVar(&c.out, "o", "", "also write the markdown to this file")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the bench process (client side) to this file")
	fs.StringVar(&c.sizingDoc, "sizing-doc", "", "measure nothing: write the WAL table of this file (docs/sizing.md) again from results/steady-*.md")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	for _, w := range strings.Split(*workers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil || n < 1 || n > 64 {
			return c, fmt.Errorf("-workers: %q is not a count from 1 to 64", w)
		}
		c.workers = append(c.workers, n)
	}
	for _, p := range strings.Split(*only, ",") {
		if p = strings.TrimSpace(p); !slices.Contains(parts, p) && !slices.Contains(optionalParts, p) {
			return c, fmt.Errorf("-only: unknown part %q (want %s)", p, strings.Join(append(parts, optionalParts...), ", "))
		}
		c.only = append(c.only, p)
	}
	switch {
	case c.rounds < 1:
		return c, errors.New("-rounds must be at least 1")
	case c.round < 10*time.Millisecond:
		return c, errors.New("-round must be at least 10ms")
	case c.delay < 0:
		return c, errors.New("-delay must not be negative")
	case c.citusColumn != "message_id" && c.citusColumn != "key":
		return c, fmt.Errorf("-citus-column must be message_id or key, got %q", c.citusColumn)
	case c.cleanupRows < 1 || c.cleanupBaseline <= 0 || c.cleanupBatch < 0:
		return c, errors.New("-cleanup-rows and -cleanup-baseline must be positive, -cleanup-batch not negative")
	}
	for _, v := range strings.Split(*versions, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 2 || n > 3 {
			return c, fmt.Errorf("-growth-versions: %q is not 2 or 3", v)
		}
		c.growth.versions = append(c.growth.versions, n)
	}
	if c.growth.rows < 1 {
		return c, errors.New("-growth-rows must be positive")
	}
	if c.runs("claimcost") {
		if len(c.only) > 1 {
			return c, errors.New("-only claimcost runs alone")
		}
		for _, w := range strings.Split(*claimParts, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(w))
			if err != nil || n < 1 || n > 200 {
				return c, fmt.Errorf("-claimcost-partitions: %q is not a count from 1 to 200", w)
			}
			c.claimCost.partitions = append(c.claimCost.partitions, n)
		}
		c.claimCost.explains = 25
		if c.claimCost.rows < 1 || c.claimCost.rounds < 1 || c.claimCost.round < 100*time.Millisecond || c.claimCost.workers < 1 {
			return c, errors.New("-claimcost-rows, -claimcost-rounds and -claimcost-workers must be positive, -claimcost-round at least 100ms")
		}
	}
	if c.runs("forget") {
		if len(c.only) > 1 {
			return c, errors.New("-only forget runs alone")
		}
		for _, w := range strings.Split(*forgetRows, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(w))
			if err != nil || n < 1 {
				return c, fmt.Errorf("-forget-rows: %q is not a positive count", w)
			}
			c.forgetRows = append(c.forgetRows, n)
		}
	}
	if c.runs("steady") {
		if len(c.only) > 1 {
			return c, errors.New("-only steady runs alone")
		}
		if c.steady.tiny {
			set := map[string]bool{}
			fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
			for name, value := range map[string]string{"steady-rate": "100", "steady-ratio": "8", "steady-cycle": "5s",
				"steady-cycles": "2", "steady-tput-for": "4s", "steady-shared-buffers": "128MB"} {
				if !set[name] {
					if err := fs.Set(name, value); err != nil {
						return c, err
					}
				}
			}
		}
		if c.steady.cycles == 0 {
			c.steady.cycles = c.steady.wholeSpanCycles()
		}
		for p := 5440; p <= 5449; p++ {
			c.steady.ports = append(c.steady.ports, p)
		}
		c.steady.command = commandLine(args)
		if err := c.steady.validate(); err != nil {
			return c, err
		}
	}
	if c.runs("soak") {
		c.soak.sampleEvery = max(5*time.Second, c.soak.duration/30)
		var err error
		if c.soak.tableAutovacuum, err = parseTableAutovacuum(*tableAV); err != nil {
			return c, err
		}
		if err := c.soak.validate(); err != nil {
			return c, err
		}
	}
	return c, nil
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if cfg.sizingDoc != "" {
		if err := writeSizingDoc(cfg.sizingDoc, "results"); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}
