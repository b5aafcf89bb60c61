// Command kafka is a Kafka consumer group that charges each order exactly
// once, however often a record is fetched: each partition's batch runs in
// pgdedup's Store.ProcessOffsets, which advances the partition's offset in
// Postgres in the same transaction as the charges, and on every assignment
// the consumer resumes from the database's offsets, not Kafka's.
//
//	kafka consume   charge orders from the topic until SIGTERM
//	kafka produce   send demo orders, some of them twice
//	kafka compare   offsets in the transaction vs one row per record: rows, WAL, throughput
//
// Settings come from flags, or else from DATABASE_URL, KAFKA_BROKERS, TOPIC
// and GROUP. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

const usage = `usage: kafka <command> [flags]

commands:
  consume   charge orders from the topic until SIGTERM or Ctrl-C
  produce   send demo orders to the topic, a share of them twice
  compare   measure offsets-in-tx against one processed_messages row per record

Run "kafka <command> -h" for the command's flags.
`

func main() {
	os.Exit(runWithSignals(os.Args[1:]))
}

// runWithSignals runs the command until it ends or SIGTERM/SIGINT cancels it.
func runWithSignals(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return run(ctx, args, os.Stdout, os.Stderr)
}

// run dispatches to a command and returns the exit code: 0 on success, 1 on
// failure, 2 on bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var cmd func(context.Context, []string, io.Writer, io.Writer) error
	switch args[0] {
	case "consume":
		cmd = runConsume
	case "produce":
		cmd = runProduce
	case "compare":
		cmd = runCompare
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "kafka: unknown command %q\n%s", args[0], usage)
		return 2
	}
	err := cmd(ctx, args[1:], stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "kafka %s: %v\n", args[0], err)
		return 1
	}
}

// errUsage is returned for bad flags, which the flag package already reported.
var errUsage = errors.New("bad usage")

// parse parses args into fs, which reports errors to stderr itself.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "unexpected arguments: %v\n", fs.Args())
		return errUsage
	}
	return nil
}

// env returns the environment variable key, or def when it is unset or empty.
func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
