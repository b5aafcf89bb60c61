package demo

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// why says, per broken recipe, how it loses or doubles charges.
var why = map[string]string{
	tableCheckThenAct: "two consumers holding the same message both find no key and both charge;\n" +
		"      a crash after the charge and before SET leaves no key, so the redelivery charges again.",
	tableInProcessSet: "a duplicate that reaches another consumer is not in that consumer's set,\n" +
		"      and a crash (restart) empties the set.",
	tableMarkThenProcess: "the key is set before the charge commits; a crash in between leaves the order\n" +
		"      marked and never charged, and every redelivery is skipped.",
}

// WriteTable writes the report. It shows the broker's figures, one row per
// recipe, the verdict on pgdedup and why the other recipes broke.
func (r *Result) WriteTable(w io.Writer) {
	o, b := r.Options, r.Broker
	fmt.Fprintf(w, "pgdedup demo: %d orders, %d consumers, redelivery rate %.2f, crash rate %.2f, seed %d\n",
		o.Orders, o.Consumers, o.RedeliverRate, o.CrashRate, o.Seed)
	fmt.Fprintf(w, "broker: %d deliveries = %d orders + %d duplicates while the first was in flight"+
		" + %d later duplicates + %d redeliveries after crashes\n\n",
		b.Deliveries, o.Orders, b.ConcurrentDups, b.LaterDups, b.CrashRedelivers)

	const format = "%-38s %10s %13s %8s %15s %14s %14s\n"
	fmt.Fprintf(w, format, "recipe", "deliveries", "dups skipped", "crashes",
		"orders charged", "charged twice", "never charged")
	fmt.Fprintf(w, format, strings.Repeat("-", 38), strings.Repeat("-", 10), strings.Repeat("-", 13),
		strings.Repeat("-", 8), strings.Repeat("-", 15), strings.Repeat("-", 14), strings.Repeat("-", 14))
	for _, row := range r.Rows {
		fmt.Fprintf(w, format, row.Recipe, itoa(row.Deliveries), itoa(row.Skipped), itoa(row.Crashes),
			itoa(row.Charged), itoa(row.ChargedTwice), itoa(row.NeverCharged))
	}
	fmt.Fprintf(w, "\nCharges are counted from each recipe's own table in schema %s"+
		" (\"charged twice\": two or more charge rows).\n", r.Schema)

	if len(r.Failures) == 0 {
		fmt.Fprintf(w, "pgdedup: OK, every order charged exactly once; processed_messages holds each order's ID once.\n")
	} else {
		fmt.Fprintf(w, "pgdedup: FAILED: %s\n", strings.Join(r.Failures, "; "))
	}
	for _, row := range r.Rows[1:] {
		if row.ChargedTwice == 0 && row.NeverCharged == 0 {
			continue
		}
		fmt.Fprintf(w, "%s: %d charged twice, %d never charged:\n      %s\n",
			row.Recipe, row.ChargedTwice, row.NeverCharged, why[row.Table])
	}
	fmt.Fprintf(w, "\nTook %s.", r.Elapsed.Round(100*time.Millisecond))
	if r.Dropped {
		fmt.Fprintf(w, " Schema %s dropped (run with --keep to inspect it).\n", r.Schema)
	} else {
		fmt.Fprintf(w, " Schema %s kept: inspect it with psql, then DROP SCHEMA %s CASCADE.\n", r.Schema, r.Schema)
	}
}

func itoa(n int64) string { return fmt.Sprint(n) }
