package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/pgdedup/pgdedup"
)

const setupHelp = `Usage: pgdedup setup --partitions N --retention D [flags]

Makes the table partitioned by claim time (docs/partitioning.md), as
Store.Setup does with Config.Layout Partitioned: give the consumers'
Retention and Partitions. Run it as the table's owner, after migrate up.
Running it again only creates missing partitions.

A table that holds IDs is moved online: it becomes the first partition,
which takes every claim until a switch time (printed), at least 10 minutes
and one partition span ahead. Claims go on throughout: each step waits at
most 200 ms for a lock, and retries. Before the switch, every process running
a pgdedup release older than the move must be stopped.

Flags:
{{flags}}
Examples:
  DATABASE_URL=postgres://owner@db/app pgdedup setup --retention 48h --partitions 12
`

func runSetup(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("setup", setupHelp, stdout, stderr)
	fs := c.flags(true)
	retention := fs.Duration("retention", pgdedup.DefaultRetention, "the consumers' Config.Retention `D`")
	partitions := fs.Int("partitions", pgdedup.DefaultPartitions, "the consumers' Config.Partitions `N`")
	if _, code, ok := c.parseArgs(fs, args, 0, ""); !ok {
		return code
	}
	store, conn, code := c.openStore(ctx, pgdedup.Config{Layout: pgdedup.LayoutPartitioned, Retention: *retention, Partitions: *partitions})
	if store == nil {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := store.Setup(ctx); err != nil {
		return c.fail(err)
	}
	st, err := store.Stats(ctx)
	if err != nil {
		return c.fail(err)
	}
	fmt.Fprintf(stdout, "%s is partitioned: %d partitions of %s\n", c.table, len(st.Partitions), st.PartitionSpan)
	// The old table of a move starts at 2000-01-01 (internal/shape/partitioned/move.go).
	if len(st.Partitions) > 0 && st.Partitions[0].From.Year() == 2000 && st.Partitions[0].To.After(time.Now()) {
		fmt.Fprintf(stdout, "moved: %s takes every claim until the switch at %s; stop every process running an older pgdedup release before then\n",
			shown(st.Partitions[0].Name), st.Partitions[0].To.Format(time.RFC3339))
	}
	return exitOK
}
