// Package cli implements the pgdedup command. Each subcommand lives in a file
// of its own. Main dispatches to them and returns the process exit code.
package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/pgdedup/pgdedup"
)

const usage = `pgdedup: operations for the pgdedup dedup table.

Usage:
  pgdedup <command> [flags]

Commands:
  migrate up|down|status|sql   apply, revert or show pgdedup's migrations
  setup --partitions N --retention D
                               make the table partitioned (moves a populated one)
  cleanup [--batch N] [--dry-run]
                               delete expired message IDs (for cron)
  stats [--json]               rows per consumer, expiry, table size
  lookup --consumer C ID...    is each ID recorded, when, until when
  forget --consumer C ID...    delete IDs' rows: their next delivery is processed
  import --consumer C          record IDs with their times, from CSV
  citus distribute [--colocate TABLE:COLUMN]...
                               distribute the table over a Citus cluster
  demo                         see exactly-once against broken recipes

The database comes from DATABASE_URL, or --database-url (a password in it is
never printed). Prefer the variable: a command line is visible to every user
of the machine (ps). Over a network, use sslmode=verify-full, which checks the
server's certificate and name (require only encrypts). The demo, given
neither, uses a server on localhost:5432 or else starts a throwaway one from
the local PostgreSQL binaries.

setup, cleanup, stats, lookup, forget and import take --table (default ` + pgdedup.DefaultTable + `,
optionally schema.table); cleanup and stats cover every consumer in it.
Run "pgdedup <command> --help" for a command's flags and examples.
`

// Main runs the pgdedup command with args (without the program name) and
// returns the exit code, which is 0 on success, 1 on failure and 2 on bad
// usage.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "-h", "--help", "-help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	case "migrate":
		return runMigrate(ctx, rest, stdout, stderr)
	case "setup":
		return runSetup(ctx, rest, stdout, stderr)
	case "cleanup":
		return runCleanup(ctx, rest, stdout, stderr)
	case "stats":
		return runStats(ctx, rest, stdout, stderr)
	case "lookup":
		return runLookup(ctx, rest, stdout, stderr)
	case "forget":
		return runForget(ctx, rest, stdout, stderr)
	case "import":
		return runImport(ctx, rest, stdout, stderr)
	case "citus":
		return runCitus(ctx, rest, stdout, stderr)
	case "demo":
		return runDemo(ctx, rest, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "pgdedup: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
}
