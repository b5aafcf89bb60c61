package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/pgdedup/pgdedup/internal/demo"
	"github.com/pgdedup/pgdedup/internal/pgserver"
)

const demoUsage = `Usage: pgdedup demo [flags]

Simulates an at-least-once broker feeding concurrent consumers that charge
orders, and runs every delivery through pgdedup and through three broken
dedup recipes (check-then-act, an in-process set per consumer, and
mark-then-process as with Redis SET NX), each charging into its own table.
Duplicates arrive while the first delivery is in flight and later; some
deliveries crash mid-handler and are redelivered. The report counts, from the
tables, the orders each recipe charged twice or never: pgdedup's must be 0 and 0.

The demo works in a new schema with a random name, never touching other data,
and drops it at the end unless --keep. It exits 1 if pgdedup's invariants fail.

The database is --database-url, else DATABASE_URL, else a server on
localhost:5432 (docker compose up -d starts one), else a throwaway cluster
started from the local PostgreSQL server binaries (initdb and pg_ctl on the
PATH or in /usr/lib/postgresql/*/bin and the like) in a temporary directory,
removed at the end.

Flags:
`

const demoExamples = `
Examples:
  pgdedup demo
  DATABASE_URL=postgres://me@db:5432/app pgdedup demo --orders 50000 --consumers 16
  pgdedup demo --redelivery-rate 0.5 --crash-rate 0.2 --keep
`

// demoLocalURL is the server tried when neither --database-url nor
// DATABASE_URL is given. It is the docker-compose service, and tests point it
// elsewhere.
var demoLocalURL = "postgres://postgres@localhost:5432/postgres?sslmode=disable"

// demoNoServerHint ends the error when no server can be found.
const demoNoServerHint = "Start one with `docker compose up -d` in pgdedup's repository, pass --database-url " +
	"or set DATABASE_URL, or install PostgreSQL's server binaries (initdb, pg_ctl; Debian: apt-get install postgresql) " +
	"for the demo to start a throwaway cluster."

// demoServer returns the URL of the server the demo runs on when no URL was
// given. It tries a server on localhost (port 5432), then a throwaway cluster
// from the local binaries, which release stops and removes.
func demoServer(ctx context.Context, stderr io.Writer) (url string, release func(), err error) {
	url, name, release, err := pgserver.Choose(ctx, demoNoServerHint,
		pgserver.Env("DATABASE_URL"), pgserver.Server(demoLocalURL), pgserver.Throwaway())
	if err != nil {
		return "", nil, err
	}
	fmt.Fprintf(stderr, "pgdedup demo: using %s\n", name)
	return url, release, nil
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pgdedup demo", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported below, usage only on --help
	var opts demo.Options
	fs.IntVar(&opts.Orders, "orders", demo.DefaultOrders, "`N` orders the producer publishes")
	fs.IntVar(&opts.Consumers, "consumers", demo.DefaultConsumers, "`N` concurrent consumers")
	fs.Float64Var(&opts.RedeliverRate, "redelivery-rate", demo.DefaultRedeliverRate,
		"the share (`RATE`, 0-1) of orders delivered twice, half while the first is in flight, half later")
	fs.Float64Var(&opts.CrashRate, "crash-rate", demo.DefaultCrashRate,
		"the share (`RATE`, 0-0.9) of deliveries whose consumer crashes mid-handler")
	fs.Uint64Var(&opts.Seed, "seed", 0, "the seed `N` of the broker's choices (default: random)")
	fs.BoolVar(&opts.Keep, "keep", false, "keep the demo's schema for inspection")
	fs.StringVar(&opts.DatabaseURL, "database-url", "",
		"the database's `URL` (default: $DATABASE_URL, else a server on localhost:5432, else a throwaway cluster)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, demoUsage, flagHelp(fs), demoExamples)
			return 0
		}
		fmt.Fprintf(stderr, "pgdedup demo: %s\nRun \"pgdedup demo --help\" for the flags.\n", flagError(fs, err))
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "pgdedup demo: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := opts.Validate(); err != nil {
		fmt.Fprintf(stderr, "pgdedup demo: %v\n", err)
		return 2
	}
	// Errors go through the redactor, as every command's do. The URL's
	// password (a throwaway cluster's too) is never printed, nor the
	// library's own "pgdedup: " after the command's.
	c := newCommand("demo", demoUsage, stdout, stderr)
	c.addURL(opts.DatabaseURL)
	if opts.DatabaseURL == "" {
		c.addURL(os.Getenv("DATABASE_URL"))
		url, release, err := demoServer(ctx, stderr)
		if err != nil {
			return c.fail(err)
		}
		defer release()
		c.addURL(url)
		opts.DatabaseURL = url
	}
	if demoIsTerminal(stderr) {
		opts.Progress = stderr
	}

	res, err := demo.Run(ctx, opts)
	if res != nil && len(res.Rows) > 0 {
		res.WriteTable(stdout)
	}
	if err != nil {
		return c.fail(err)
	}
	return 0
}

// demoIsTerminal reports whether w is a terminal, where a progress bar that
// redraws itself helps. In a log file or a pipe it would be noise.
func demoIsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
