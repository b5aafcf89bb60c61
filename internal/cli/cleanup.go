package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/pgdedup/pgdedup"
)

const cleanupHelp = `Usage: pgdedup cleanup [--batch N] [--dry-run] [--json] [--turn-wait D] [--retention D] [--runway D] [flags]

Deletes the message IDs whose retention has passed (expires_at before now),
of every consumer in the table, in transactions of at most N rows each, and
prints how many rows it deleted and how long it took. Rows that have not
expired are never touched. Exits non-zero on failure; the batches committed
before a failure stay deleted, so the next run picks up where it stopped.
On a partitioned table (docs/partitioning.md) it creates the partitions
ahead (--runway; at most 8 per round, nearest first), seals and drops the partitions that ended --retention ago (give the
consumers' Retention) and whose rows have all expired, and prints each
partition it created and dropped with its span; the rows are PostgreSQL's
estimate.

Safe to run from several places at once (cleaners take turns) and while
consumers are processing. For cron, or a Kubernetes CronJob. When another
session holds the cleaners' turn, it waits for it up to --turn-wait, then
exits non-zero naming the session that holds it: expired rows pile up until
that session lets go.

Flags:
{{flags}}
Examples:
  DATABASE_URL='postgres://app@db:5432/app?sslmode=verify-full' pgdedup cleanup
  DATABASE_URL=postgres://app@db/app pgdedup cleanup --dry-run
  DATABASE_URL=postgres://app@db/app pgdedup cleanup --json | jq .dropped_partitions
  # crontab: every 15 minutes
  */15 * * * * DATABASE_URL=postgres://app@db/app pgdedup cleanup --timeout 10m
`

// cleanupJSON is the --json output of cleanup.
type cleanupJSON struct {
	Table   string  `json:"table"`
	Deleted int64   `json:"deleted_rows"` // on a partitioned table, the dropped partitions' rows, estimated
	Seconds float64 `json:"seconds"`
	// Created and Dropped are the partitions created and dropped. They are null
	// on a plain table.
	Created []pgdedup.PartitionSpan `json:"created_partitions"`
	Dropped []pgdedup.PartitionSpan `json:"dropped_partitions"`
}

func runCleanup(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("cleanup", cleanupHelp, stdout, stderr)
	fs := c.flags(true)
	batch := fs.Int("batch", pgdedup.DefaultCleanupBatchSize, "delete at most `N` rows per transaction")
	dryRun := fs.Bool("dry-run", false, "only count the expired rows; delete nothing")
	timeout := fs.Duration("timeout", 0, "give up after `D`, e.g. 10m; committed batches stay deleted (default: no limit)")
	verbose := fs.Bool("verbose", false, "log each batch (rows and time) to stderr")
	asJSON := fs.Bool("json", false, "print one JSON object (times in RFC 3339)")
	turnWait := fs.Duration("turn-wait", 30*time.Second, "wait up to `D` for another cleaner's turn to end, then fail")
	retention := fs.Duration("retention", pgdedup.DefaultRetention,
		"partitioned table: drop a partition only once it ended `D` ago (give the consumers' Config.Retention)")
	runway := fs.Duration("runway", 0,
		"partitioned table: keep partitions created `D` ahead, e.g. 48h (default: Config.Runway's, 48h or --retention if shorter)")
	_, code, ok := c.parseArgs(fs, args, 0, "")
	switch {
	case !ok:
		return code
	case *runway < 0:
		return c.usageError("--runway must not be negative, got %s", *runway)
	case *batch <= 0:
		return c.usageError("--batch must be a positive number of rows, got %d", *batch)
	case *timeout < 0:
		return c.usageError("--timeout must not be negative, got %s", *timeout)
	case *turnWait < 0:
		return c.usageError("--turn-wait must not be negative, got %s", *turnWait)
	case *retention < pgdedup.MinRetention:
		return c.usageError("--retention must be at least %s, got %s", pgdedup.MinRetention, *retention)
	}
	var logger *slog.Logger
	if *verbose {
		logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	var run pgdedup.Event // the run's EventCleanup, with the partitions it created and dropped
	store, conn, code := c.openStore(ctx, pgdedup.Config{
		CleanupBatchSize: *batch,
		Retention:        *retention,
		Runway:           *runway,
		CleanupTurnWait:  max(*turnWait, time.Nanosecond), // 0 means one try, failing without the turn
		Logger:           logger,
		OnEvent: func(_ context.Context, e pgdedup.Event) {
			if e.Kind == pgdedup.EventCleanup {
				run = e
			}
		},
	})
	if store == nil {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))

	if *dryRun {
		var expired int64
		var partitioned bool
		err := conn.QueryRow(ctx, `SELECT relkind = 'p' FROM pg_catalog.pg_class WHERE oid = $1::regclass`, store.Table()).Scan(&partitioned)
		if err == nil { // in a statement of its own, because Citus refuses a subquery beside a distributed table's count
			err = conn.QueryRow(ctx, `SELECT count(*) FROM `+store.Table()+` WHERE expires_at < now()`).Scan(&expired)
		}
		if err != nil {
			return c.fail(fmt.Errorf("count expired rows: %w", err))
		}
		if partitioned {
			fmt.Fprintf(stdout, "dry run: %d expired rows in %s, a partitioned table: cleanup deletes no row, it drops each partition "+
				"whose rows have all expired once it ended --retention (%s) ago; nothing was changed\n", expired, c.table, *retention)
			return exitOK
		}
		batches, plural := (expired+int64(*batch)-1)/int64(*batch), "es"
		if batches == 1 {
			plural = ""
		}
		fmt.Fprintf(stdout, "dry run: %d expired rows in %s would be deleted, in %d batch%s of at most %d; nothing was deleted\n",
			expired, c.table, batches, plural, *batch)
		return exitOK
	}

	start := time.Now()
	deleted, err := store.Cleanup(ctx)
	took := time.Since(start).Round(time.Millisecond)
	if err != nil {
		return c.fail(fmt.Errorf("stopped after deleting %d expired rows from %s in %s: %w", deleted, c.table, took, err))
	}
	if *asJSON {
		out := cleanupJSON{Table: c.table, Deleted: deleted, Seconds: took.Seconds(), Created: run.Created, Dropped: run.Dropped}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return c.fail(err)
		}
		return exitOK
	}
	if run.Dropped == nil { // a plain table
		fmt.Fprintf(stdout, "deleted %d expired rows from %s in %s\n", deleted, c.table, took)
		return exitOK
	}
	fmt.Fprintf(stdout, "dropped %d and created %d partitions of %s (about %d rows dropped) in %s\n",
		len(run.Dropped), len(run.Created), c.table, deleted, took)
	for _, p := range run.Dropped {
		fmt.Fprintf(stdout, "dropped %s: %s to %s\n", p.Name, p.From.Format(time.RFC3339Nano), p.To.Format(time.RFC3339Nano))
	}
	for _, p := range run.Created {
		fmt.Fprintf(stdout, "created %s: %s to %s\n", p.Name, p.From.Format(time.RFC3339Nano), p.To.Format(time.RFC3339Nano))
	}
	return exitOK
}
