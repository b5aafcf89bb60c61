package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
)

// The forget part (-only forget) measures what retention costs when it comes
// due: for each size in -forget-rows, that many IDs, all expired, are
// forgotten by one Cleanup run, on the plain layout (a DELETE in batches)
// and on the partitioned one (the IDs fill one partition, which the run
// detaches and drops). It reports the run's time and the WAL the server
// wrote meanwhile, side by side, per size.

// forgetRetention is the partitioned table's Retention: 1-second partitions,
// so that a partition is due for dropping seconds after it ends.
const (
	forgetRetention  = 4 * time.Second
	forgetPartitions = 4
)

// forgetResult is one table's run.
type forgetResult struct {
	rows    int
	took    time.Duration // the Cleanup run that forgot the IDs
	wal     int64         // bytes of WAL the server wrote during it
	removed int64         // rows the run deleted, or the dropped partition's
}

func forget(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	start, loadBefore := time.Now(), loadAverage()
	prog := newProgress(stderr, 2*len(cfg.forgetRows))
	var server string
	var plain, parted []forgetResult
	for _, n := range cfg.forgetRows {
		for _, partitioned := range []bool{false, true} {
			r, version, err := forgetRun(ctx, cfg.databaseURL, n, partitioned)
			if err != nil {
				return fmt.Errorf("forget: %d rows (partitioned %v): %w", n, partitioned, err)
			}
			server = version
			if partitioned {
				parted = append(parted, r)
			} else {
				plain = append(plain, r)
			}
			prog.step("%d rows, partitioned %v: %s", n, partitioned, r.took.Round(time.Millisecond))
		}
	}
	prog.finish()
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	loadAfter := loadAverage()
	p("## Time to forget expired IDs, plain and partitioned\n\n")
	p("- Command: `%s`\n", commandLine(cfg.args))
	p("- Date: %s UTC, took %s\n", start.UTC().Format("2006-01-02 15:04"), time.Since(start).Round(time.Second))
	p("- Machine: %d cores (%s), %s RAM, load average (1, 5, 15 min) %s at the start, %s at the end; the bench and the server share it. %s\n",
		runtime.NumCPU(), cpuModel(), memTotal(), loadBefore, loadAfter, busy(loadBefore, loadAfter))
	p("- PostgreSQL: %s, the -database-url server as it is configured\n", strings.SplitN(server, ",", 2)[0])
	p("- Each size: a fresh schema per layout; that many IDs written with one raw-SQL `INSERT` (as `pgdedup import` does), all expired, then `VACUUM ANALYZE` and `CHECKPOINT`; then one `Store.Cleanup` run is timed and the WAL the server wrote during it measured (`pg_current_wal_lsn()`). Plain: the run deletes the rows in batches of `CleanupBatchSize` (%s, the default), leaving as many dead tuples for vacuum. Partitioned (Retention %s, %d partitions, so that the partition is due seconds after it ends; the IDs fill one partition): earlier runs seal it, and the timed run is the one that detaches (`CONCURRENTLY`) and drops it\n\n",
		count(pgdedup.DefaultCleanupBatchSize), forgetRetention, forgetPartitions)
	p("| IDs | plain: Cleanup deletes them | its WAL | partitioned: Cleanup drops their partition | its WAL | plain ÷ partitioned (time) |\n")
	p("|--:|--:|--:|--:|--:|--:|\n")
	for i := range plain {
		p("| %s | %s ms | %s | %s ms | %s | %.0f× |\n", count(float64(plain[i].rows)),
			ms(plain[i].took), walSize(plain[i].wal), ms(parted[i].took), walSize(parted[i].wal),
			float64(plain[i].took)/float64(max(parted[i].took, time.Microsecond)))
	}
	p("\nThe plain run deletes, logs and leaves for vacuum every row: its time and WAL grow with the rows. The partitioned run is a detach and a drop: compare its WAL and time across the sizes.\n")
	return write(cfg, stdout, b.String())
}

// walSize formats bytes of WAL.
func walSize(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%.1f MB", float64(n)/1e6)
}

// forgetRun makes one table of n expired IDs in a schema of its own,
// dropped at the end, and times the Cleanup run that forgets them.
func forgetRun(ctx context.Context, url string, n int, partitioned bool) (r forgetResult, version string, err error) {
	r.rows = n
	schema := "pgdedup_forget_" + randomHex(4)
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		return r, "", err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, derr := admin.Exec(cctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		err = errors.Join(err, derr)
		admin.Close(cctx)
	}()
	if err := admin.QueryRow(ctx, `SELECT version()`).Scan(&version); err != nil {
		return r, "", err
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return r, version, err
	}
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return r, version, err
	}
	pc.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return r, version, err
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	err = pgdedup.Migrate(ctx, db)
	db.Close()
	if err != nil {
		return r, version, err
	}
	scfg := pgdedup.Config{Consumer: consumer, Table: schema + ".processed_messages", Retention: forgetRetention}
	if partitioned {
		scfg.Layout, scfg.Partitions = pgdedup.LayoutPartitioned, forgetPartitions
	}
	store, err := pgdedup.New(pool, scfg)
	if err != nil {
		return r, version, err
	}
	if partitioned {
		if err := store.Setup(ctx); err != nil {
			return r, version, err
		}
		if _, err := store.Cleanup(ctx); err != nil { // the partitions ahead
			return r, version, err
		}
	}
	// Every ID in the partition of the clock now (its start: at), expired
	// within it; on the plain table the same times.
	var at time.Time
	if err := pool.QueryRow(ctx, `SELECT date_bin($1::interval, clock_timestamp(), '2000-01-01 00:00:00+00')`,
		(forgetRetention / forgetPartitions).String()).Scan(&at); err != nil {
		return r, version, err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, processed_at, expires_at)
SELECT $1, 'forget-' || i, $2::timestamptz, $2::timestamptz + interval '1 millisecond' FROM generate_series(1, $3::int) i`, consumer, at, n); err != nil {
		return r, version, err
	}
	for _, q := range []string{"VACUUM ANALYZE processed_messages", "CHECKPOINT"} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return r, version, err
		}
	}
	if partitioned {
		// Until the partition is due: ended a Retention ago and sealed.
		// Cleanups seal it; they stop half a Retention before it is due,
		// so that none of them drops it before the timed one (a Cleanup
		// that began just before due would otherwise find it due).
		due := at.Add(forgetRetention/forgetPartitions + forgetRetention)
		var early pgdedup.Event
		sealer, err := pgdedup.New(pool, withEvents(scfg, &early))
		if err != nil {
			return r, version, err
		}
		for {
			var now time.Time
			if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
				return r, version, err
			}
			if !now.Before(due) {
				break
			}
			if due.Sub(now) > forgetRetention/2 {
				if _, err := sealer.Cleanup(ctx); err != nil {
					return r, version, err
				}
				if len(early.Dropped) > 0 {
					return r, version, fmt.Errorf("a Cleanup %v before the partition was due dropped it", due.Sub(now))
				}
			}
			select {
			case <-ctx.Done():
				return r, version, ctx.Err()
			case <-time.After(min(due.Sub(now), 200*time.Millisecond)):
			}
		}
		var sealed bool
		if err := pool.QueryRow(ctx, `SELECT sealed >= $1 FROM pgdedup_partitions WHERE parent = 'processed_messages'::regclass`,
			at.Add(forgetRetention/forgetPartitions)).Scan(&sealed); err != nil {
			return r, version, err
		}
		if !sealed {
			return r, version, errors.New("the partition was not sealed half a Retention before it was due")
		}
		if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
			return r, version, err
		}
	}
	var before, after int64
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'`).Scan(&before); err != nil {
		return r, version, err
	}
	var event pgdedup.Event
	timed, err := pgdedup.New(pool, withEvents(scfg, &event))
	if err != nil {
		return r, version, err
	}
	t0 := time.Now()
	removed, err := timed.Cleanup(ctx)
	r.took = time.Since(t0)
	if err != nil {
		return r, version, err
	}
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'`).Scan(&after); err != nil {
		return r, version, err
	}
	r.wal, r.removed = after-before, removed
	if partitioned && len(event.Dropped) == 0 {
		return r, version, fmt.Errorf("the timed Cleanup dropped no partition (%d rows)", removed)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages WHERE message_id LIKE 'forget-%'`).Scan(&left); err != nil {
		return r, version, err
	}
	if left != 0 {
		return r, version, fmt.Errorf("%d of %d IDs still recorded after the timed Cleanup", left, n)
	}
	return r, version, nil
}

// withEvents returns cfg with OnEvent keeping the last cleanup event in e.
func withEvents(cfg pgdedup.Config, e *pgdedup.Event) pgdedup.Config {
	cfg.OnEvent = func(_ context.Context, ev pgdedup.Event) {
		if ev.Kind == pgdedup.EventCleanup {
			*e = ev
		}
	}
	return cfg
}
