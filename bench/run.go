package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// run performs the parts cfg asks for and writes the report to stdout (and
// to cfg.out). The schema and Redis keys are removed even when it fails.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) (err error) {
	if slices.Equal(cfg.only, []string{"soak"}) { // needs neither DATABASE_URL nor Redis
		return soak(ctx, cfg, stdout, stderr)
	}
	if slices.Equal(cfg.only, []string{"claimcost"}) { // nor Redis
		return claimCost(ctx, cfg, stdout, stderr)
	}
	if slices.Equal(cfg.only, []string{"forget"}) { // nor Redis
		return forget(ctx, cfg, stdout, stderr)
	}
	if slices.Equal(cfg.only, []string{"steady"}) { // nor this
		return steady(ctx, cfg, stdout, stderr)
	}
	rep := &report{cfg: cfg, start: time.Now(), loadBefore: loadAverage()}
	b, err := newBench(ctx, cfg)
	if err != nil {
		return err
	}
	defer b.close()
	if rep.machine, rep.settings, err = b.machine(ctx); err != nil {
		return err
	}

	prog := newProgress(stderr, plannedSteps(cfg))
	defer prog.finish()
	if cfg.runs("accounting") {
		if rep.costs, rep.walMethod, err = b.account(ctx, prog); err != nil {
			return err
		}
	}
	if cfg.runs("messages") {
		t, err := b.runMessages(ctx, "loopback", 0, prog)
		if err != nil {
			return err
		}
		rep.tables = append(rep.tables, t)
	}
	if cfg.runs("delayed") && cfg.delay > 0 {
		t, err := b.runMessages(ctx, fmt.Sprintf("+%s each way", cfg.delay), cfg.delay, prog)
		if err != nil {
			return err
		}
		t.delayed = true
		rep.tables = append(rep.tables, t)
	}
	if cfg.runs("batch") {
		if rep.batches, err = b.runBatches(ctx, prog); err != nil {
			return err
		}
	}
	if cfg.runs("cleanup") {
		c, err := b.runCleanup(ctx, prog)
		if err != nil {
			return err
		}
		rep.cleanup = &c
	}
	if cfg.runs("citus") {
		if rep.citus, err = b.runCitus(ctx, prog); err != nil {
			return err
		}
	}
	if cfg.runs("growth") {
		if rep.growth, err = b.runGrowth(ctx, prog); err != nil {
			return err
		}
	}
	rep.loadAfter = loadAverage()
	rep.took = time.Since(rep.start)
	if err := write(cfg, stdout, rep.markdown()); err != nil {
		return err
	}
	if cfg.runs("soak") {
		return soak(ctx, cfg, stdout, stderr)
	}
	return nil
}

// soak runs the soak and writes its report (appended to cfg.out's, if any).
// It fails when the soak fails one of its checks.
func soak(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	prog := newProgress(stderr, 3+int(cfg.soak.duration/cfg.soak.sampleEvery))
	start, loadBefore := time.Now(), loadAverage()
	r, err := runSoak(ctx, cfg.soak, prog)
	prog.finish()
	if err != nil {
		return err
	}
	loadAfter := loadAverage()
	md := r.markdown(loadBefore, loadAfter)
	if slices.Equal(cfg.only, []string{"soak"}) {
		err = write(cfg, stdout, header(cfg.args, start, time.Since(start), loadBefore, loadAfter)+"\n"+md)
	} else {
		err = appendTo(cfg, stdout, md)
	}
	if err != nil {
		return err
	}
	if !r.passed() {
		return errors.New("soak: a check failed (see the report)")
	}
	return nil
}

// steady runs the steady part and writes its report. It fails when a check
// fails.
func steady(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	prog := newProgress(stderr, 8+2*cfg.steady.cycles*int(max(1, cfg.steady.cycle/(5*time.Second))))
	r, err := runSteady(ctx, cfg.steady, prog)
	prog.finish()
	if err != nil {
		return err
	}
	if err := write(cfg, stdout, r.markdown()); err != nil {
		return err
	}
	if !r.passed() {
		return errors.New("steady: a check failed (see the report)")
	}
	return nil
}

// write writes md to stdout and to cfg.out.
func write(cfg config, stdout io.Writer, md string) error {
	if _, err := io.WriteString(stdout, md); err != nil {
		return err
	}
	if cfg.out != "" {
		return os.WriteFile(cfg.out, []byte(md), 0o644)
	}
	return nil
}

// appendTo writes md to stdout and appends it to cfg.out.
func appendTo(cfg config, stdout io.Writer, md string) error {
	if _, err := io.WriteString(stdout, md); err != nil {
		return err
	}
	if cfg.out == "" {
		return nil
	}
	f, err := os.OpenFile(cfg.out, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = io.WriteString(f, md)
	return errors.Join(err, f.Close())
}

func plannedSteps(cfg config) int {
	n := 0
	perRound := len(cfg.workers) * (cfg.rounds + 1)
	if cfg.runs("accounting") {
		n += len(messageScenarios)
	}
	if cfg.runs("messages") {
		n += perRound * len(messageScenarios)
	}
	if cfg.runs("delayed") && cfg.delay > 0 {
		n += perRound * len(messageScenarios)
	}
	if cfg.runs("batch") {
		n += perRound * len(batchCases)
	}
	if cfg.runs("cleanup") {
		n += 3
	}
	if cfg.runs("growth") {
		tables := 2 * len(cfg.growth.versions)
		n += tables + len(cfg.workers)*(cfg.rounds+1)*len(growthScenarios)*tables
	}
	if cfg.runs("citus") {
		n += len(cfg.workers)*(cfg.rounds+1)*len(citusScenarios) + 4
	}
	return n
}

// machine describes where the numbers come from, beside header's CPU and
// RAM: Postgres and its settings (reported, never changed, and returned by
// name), Redis.
func (b *bench) machine(ctx context.Context) ([]string, map[string]string, error) {
	var pgVersion string
	if err := b.admin.QueryRow(ctx, `SELECT version()`).Scan(&pgVersion); err != nil {
		return nil, nil, err
	}
	rows, err := b.admin.Query(ctx, `SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY($1) ORDER BY name`,
		[]string{"synchronous_commit", "fsync", "wal_sync_method", "full_page_writes", "wal_level", "shared_buffers",
			"wal_buffers", "max_wal_size", "checkpoint_timeout", "autovacuum", "commit_delay", "max_connections"})
	if err != nil {
		return nil, nil, err
	}
	var settings []string
	byName := map[string]string{}
	for rows.Next() {
		var name, setting string
		if err := rows.Scan(&name, &setting); err != nil {
			return nil, nil, err
		}
		settings = append(settings, name+"="+setting)
		byName[name] = setting
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: b.cfg.redisAddr})
	defer rdb.Close()
	redisInfo := "unknown"
	if info, err := rdb.Info(ctx, "server").Result(); err == nil {
		redisInfo = field(info, "redis_version:")
	}
	if v, err := rdb.ConfigGet(ctx, "appendonly").Result(); err == nil {
		redisInfo += ", appendonly=" + v["appendonly"]
	}
	return []string{
		fmt.Sprintf("GOMAXPROCS %d", runtime.GOMAXPROCS(0)),
		"PostgreSQL: " + strings.SplitN(pgVersion, ",", 2)[0] + ", on the same machine",
		"Postgres settings (server defaults of this machine, not tuned): " + strings.Join(settings, ", "),
		"Redis: " + redisInfo + ", on the same machine",
	}, byName, nil
}

func field(text, prefix string) string {
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, prefix) {
			return strings.TrimSpace(strings.TrimPrefix(line, prefix))
		}
	}
	return "unknown"
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown model"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown model"
}

// loadAverage is /proc/loadavg's 1, 5 and 15 minute load, or "unknown".
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
