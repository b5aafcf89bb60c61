package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgdedup/pgdedup"
)

const statsHelp = `Usage: pgdedup stats [--json] [flags]

Prints the size of the table and of its indexes, its dead tuples (rows deleted
and not yet vacuumed) and when it was last vacuumed and autovacuumed; then, per
consumer: the rows held, the oldest processed_at, the rows already expired
(deleted by the next cleanup), and the next expiry among the rest; then each
index and its size. It reads the whole table: on tens of millions of rows,
expect it to take seconds.

Flags:
{{flags}}
Examples:
  pgdedup stats --database-url 'postgres://app@db:5432/app?sslmode=require'
  DATABASE_URL=postgres://app@db/app pgdedup stats --json | jq '.consumers[] | {consumer, expired_rows}'
`

// stats is what stats prints; its JSON form is the --json output.
type stats struct {
	Table string `json:"table"`
	pgdedup.Stats
}

func runStats(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("stats", statsHelp, stdout, stderr)
	fs := c.flags(true)
	asJSON := fs.Bool("json", false, "print JSON instead of a table (times in RFC 3339, sizes in bytes)")
	rest, code, ok := c.parse(fs, args)
	switch {
	case !ok:
		return code
	case len(rest) > 0:
		return c.usageError("unexpected argument %q", rest[0])
	}
	store, conn, code := c.openStore(ctx, 0, nil)
	if store == nil {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ps, err := store.Stats(ctx)
	if err != nil {
		return c.fail(err)
	}
	st := stats{Table: c.table, Stats: ps}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(st); err != nil {
			return c.fail(err)
		}
		return exitOK
	}
	printStats(stdout, st)
	return exitOK
}

func printStats(w io.Writer, st stats) {
	fmt.Fprintf(w, "%s: %d rows, %d expired; %s (table %s, indexes %s)\n", st.Table, st.Rows, st.ExpiredRows,
		bytes(st.TotalBytes), bytes(st.TableBytes), bytes(st.IndexBytes))
	if len(st.Indexes) > 0 { // not on Citus: see pgdedup.Store.Stats
		fmt.Fprintf(w, "%d dead tuples; last vacuum %s, last autovacuum %s\n", st.DeadTuples,
			when(st.LastVacuum, st.Now), when(st.LastAutovacuum, st.Now))
	}
	fmt.Fprintln(w)
	if len(st.Consumers) == 0 {
		fmt.Fprintln(w, "no rows")
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CONSUMER\tROWS\tEXPIRED\tOLDEST PROCESSED\tNEXT EXPIRY")
		for _, cs := range st.Consumers {
			next := "-"
			if cs.NextExpiry != nil {
				next = fmt.Sprintf("%s (in %s)", cs.NextExpiry.Format(time.RFC3339), roughly(cs.NextExpiry.Sub(st.Now)))
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s (%s ago)\t%s\n", cs.Consumer, cs.Rows, cs.ExpiredRows,
				cs.OldestProcessedAt.Format(time.RFC3339), roughly(st.Now.Sub(cs.OldestProcessedAt)), next)
		}
		tw.Flush()
	}
	if len(st.Indexes) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "INDEX\tMETHOD\tSIZE")
		for _, ix := range st.Indexes {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", ix.Name, ix.Method, bytes(ix.Bytes))
		}
		tw.Flush()
	}
	if st.ExpiredRows > 0 {
		fmt.Fprintf(w, "\n%d expired rows wait for cleanup (RunCleaner, or `pgdedup cleanup`)\n", st.ExpiredRows)
	}
}

// when formats t as RFC 3339 and how long before now, or "never".
func when(t *time.Time, now time.Time) string {
	if t == nil {
		return "never"
	}
	return fmt.Sprintf("%s (%s ago)", t.Format(time.RFC3339), roughly(now.Sub(*t)))
}

// roughly formats d to the second, or to the minute beyond an hour ("3h5m").
func roughly(d time.Duration) string {
	if d.Abs() > time.Hour {
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	}
	return d.Round(time.Second).String()
}

// bytes formats n in kB, MB or GB (powers of 1024, like pg_size_pretty).
func bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d bytes", n)
	}
	v, suffix := float64(n)/unit, "kB"
	for _, s := range []string{"MB", "GB", "TB"} {
		if v < unit {
			break
		}
		v, suffix = v/unit, s
	}
	return fmt.Sprintf("%.1f %s", v, suffix)
}
