package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/pgdedup/pgdedup"
)

const statsHelp = `Usage: pgdedup stats [--json] [flags]

Prints the size of the table and of its indexes, its dead tuples (rows deleted
and not yet vacuumed) and when it was last vacuumed and autovacuumed; then, per
consumer: the rows held, the oldest processed_at, the rows already expired
(deleted by the next cleanup), and the next expiry among the rest; then each
index and its size, or on a partitioned table each partition with its span,
rows, size and state, and the runway: how long claims find a partition if no
cleanup runs (partition_runway in --json, in nanoseconds). On a plain table it
estimates the full-page images a claim logs after checkpoints, here and on the
partitioned layout (wal_estimate; docs/sizing.md). It reads the whole table: on tens of millions of rows,
expect it to take seconds.

It shows the --max-consumers consumers with the most rows, and says how many
others there are and what they hold. Consumer names are written by whoever
can insert into the table: a name that is not plain printable text is shown
quoted, with escapes (\x1b, \n, \u202e…), and a long one is cut short. The
JSON output carries the names as they are, escaped by JSON.

Flags:
{{flags}}
Examples:
  DATABASE_URL='postgres://app@db:5432/app?sslmode=verify-full' pgdedup stats
  DATABASE_URL=postgres://app@db/app pgdedup stats --json | jq '.consumers[] | {consumer, expired_rows}'
`

// defaultMaxConsumers is how many consumers stats shows unless told otherwise.
// It is a screenful, and a bound on the output however many consumers some
// role with INSERT on the table has written.
const defaultMaxConsumers = 100

// maxShownName is how many bytes of a consumer name the table shows.
const maxShownName = 100

// stats is what stats prints. Its JSON form is the --json output.
type stats struct {
	Table string `json:"table"`
	pgdedup.Stats
	// LeftOut sums up the consumers beyond --max-consumers, which Consumers
	// leaves out.
	LeftOut leftOut `json:"consumers_left_out"`
	// WAL models what full-page images cost a claim on a plain table, and
	// what the partitioned layout would cost (nil on a partitioned table).
	WAL *walEstimate `json:"wal_estimate,omitempty"`
}

// leftOut is what the consumers stats does not show hold.
type leftOut struct {
	Consumers   int   `json:"consumers"`
	Rows        int64 `json:"rows"`
	ExpiredRows int64 `json:"expired_rows"`
}

func runStats(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("stats", statsHelp, stdout, stderr)
	fs := c.flags(true)
	asJSON := fs.Bool("json", false, "print JSON instead of a table (times in RFC 3339, sizes in bytes)")
	maxConsumers := fs.Int("max-consumers", defaultMaxConsumers, "show at most `N` consumers, those with the most rows")
	_, code, ok := c.parseArgs(fs, args, 0, "")
	switch {
	case !ok:
		return code
	case *maxConsumers <= 0:
		return c.usageError("--max-consumers must be a positive number, got %d", *maxConsumers)
	}
	store, conn, code := c.openStore(ctx, pgdedup.Config{})
	if store == nil {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ps, err := store.Stats(ctx)
	if err != nil {
		return c.fail(err)
	}
	st := stats{Table: c.table, Stats: ps}
	if cp, err := checkpointTimeout(ctx, conn); err == nil {
		st.WAL = estimateWAL(ps, cp)
	}
	st.Consumers, st.LeftOut = largest(ps.Consumers, *maxConsumers)
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

// largest returns the n consumers with the most rows (ties by name), in
// their order in all, and what the others hold.
func largest(all []pgdedup.ConsumerStats, n int) ([]pgdedup.ConsumerStats, leftOut) {
	if len(all) <= n {
		return all, leftOut{}
	}
	order := make([]int, len(all))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(all[b].Rows, all[a].Rows) })
	keep := order[:n]
	slices.Sort(keep)
	shown := make([]pgdedup.ConsumerStats, 0, n)
	for _, i := range keep {
		shown = append(shown, all[i])
	}
	out := leftOut{Consumers: len(all) - n}
	for _, i := range order[n:] {
		out.Rows += all[i].Rows
		out.ExpiredRows += all[i].ExpiredRows
	}
	return shown, out
}

// shown is s as the table shows text read from the database. Plain printable
// text is shown as it is. Anything else is quoted with Go's escapes, so that
// no control character (a terminal escape, a newline, a tab that breaks the
// columns) or invisible formatting character (a right-to-left override)
// reaches the terminal. Long text is cut short.
func shown(s string) string {
	cut := ""
	if len(s) > maxShownName {
		cut = fmt.Sprintf("…(%d bytes)", len(s))
		end := maxShownName
		for end > 0 && !utf8.RuneStart(s[end]) {
			end--
		}
		s = s[:end]
	}
	plain := s != "" && s == strings.TrimSpace(s) && !strings.HasPrefix(s, `"`) && utf8.ValidString(s)
	for _, r := range s {
		plain = plain && unicode.IsPrint(r)
	}
	if !plain {
		s = strconv.Quote(s)
	}
	return s + cut
}

func printStats(w io.Writer, st stats) {
	fmt.Fprintf(w, "%s: %d rows, %d expired; %s (table %s, indexes %s)\n", st.Table, st.Rows, st.ExpiredRows,
		bytes(st.TotalBytes), bytes(st.TableBytes), bytes(st.IndexBytes))
	if len(st.Indexes) > 0 { // not on Citus, see pgdedup.Store.Stats
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
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s (%s ago)\t%s\n", shown(cs.Consumer), cs.Rows, cs.ExpiredRows,
				cs.OldestProcessedAt.Format(time.RFC3339), roughly(st.Now.Sub(cs.OldestProcessedAt)), next)
		}
		tw.Flush()
	}
	if n := st.LeftOut.Consumers; n > 0 {
		fmt.Fprintf(w, "… and %d more consumers, with %d rows, %d expired (shown: the %d with the most rows; --max-consumers to change)\n",
			n, st.LeftOut.Rows, st.LeftOut.ExpiredRows, len(st.Consumers))
	}
	if len(st.Indexes) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "INDEX\tMETHOD\tSIZE")
		for _, ix := range st.Indexes {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", shown(ix.Name), shown(ix.Method), bytes(ix.Bytes))
		}
		tw.Flush()
	}
	if len(st.Partitions) > 0 {
		printPartitions(w, st)
	}
	if e := st.WAL; e != nil {
		fmt.Fprintf(w, "\nWAL: holding %s at checkpoint_timeout %s (%.0f cycles), %.0f rows per page of %s, a claim logs about %.2f full-page images (%s) after checkpoints; with the partitioned layout's %d partitions, about %.2f (%s). An empty table's claim logs about 0.6 kB in all (docs/sizing.md).\n",
			roughly(e.Held), e.CheckpointTimeout, float64(e.Held)/float64(e.CheckpointTimeout), e.RowsPerPage, shown(e.KeyIndex),
			e.PlainImages, bytes(int64(e.PlainBytes)), e.Partitions, e.PartitionedImages, bytes(int64(e.PartitionedBytes)))
	}
	if st.ExpiredRows > 0 {
		fmt.Fprintf(w, "\n%d expired rows wait for cleanup (RunCleaner, or `pgdedup cleanup`)\n", st.ExpiredRows)
	}
}

// printPartitions lists the partitions of a partitioned table, oldest
// first, with their spans, rows, sizes and states.
func printPartitions(w io.Writer, st stats) {
	fmt.Fprintf(w, "\n%d partitions of %s each", len(st.Partitions), st.PartitionSpan)
	if st.SealedBefore != nil {
		fmt.Fprintf(w, ", sealed before %s", st.SealedBefore.Format(time.RFC3339Nano))
	}
	fmt.Fprintln(w, " (rows include hand-over copies)")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tFROM\tTO\tROWS\tSIZE\tSTATE")
	for _, p := range st.Partitions {
		state := "unsealed"
		switch {
		case p.Detaching:
			state = "detaching"
		case p.Sealed:
			state = "sealed"
		case p.From.After(st.Now):
			state = "ahead"
		case p.To.After(st.Now):
			state = "current"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", shown(p.Name), p.From.Format(time.RFC3339Nano), p.To.Format(time.RFC3339Nano),
			p.Rows, bytes(p.Bytes), state)
	}
	tw.Flush()
	if st.PartitionRunway != nil {
		fmt.Fprintf(w, "runway %s: without a cleanup, claims find a partition until %s\n", roughly(*st.PartitionRunway),
			st.Now.Add(*st.PartitionRunway).Format(time.RFC3339))
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
