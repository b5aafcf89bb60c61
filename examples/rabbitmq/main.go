// Command rabbitmq is a RabbitMQ consumer that charges each order exactly once,
// however often RabbitMQ delivers it: each delivery runs in pgdedup's
// Store.Process, which records the message ID in the same transaction as the
// charge, and is acked only after that transaction commits.
//
//	rabbitmq migrate   create processed_messages and charges
//	rabbitmq consume   charge orders from the queue until SIGTERM
//	rabbitmq publish   send demo orders, some of them twice
//
// Settings come from flags, or else from DATABASE_URL, AMQP_URL, QUEUE,
// PREFETCH and WORKERS. See README.md.
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
	"strconv"
	"syscall"
)

const usage = `usage: rabbitmq <command> [flags]

commands:
  migrate   create processed_messages and the charges table (idempotent)
  consume   charge orders from the queue until SIGTERM or Ctrl-C
  publish   send demo orders to the queue, a share of them twice

Run "rabbitmq <command> -h" for the command's flags.
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
	case "migrate":
		cmd = runMigrate
	case "consume":
		cmd = runConsume
	case "publish":
		cmd = runPublish
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "rabbitmq: unknown command %q\n%s", args[0], usage)
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
		fmt.Fprintf(stderr, "rabbitmq %s: %v\n", args[0], err)
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

// envInt is env for numbers; a malformed value falls back to def with a
// warning rather than silently becoming 0.
func envInt(key string, def int, stderr io.Writer) int {
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		fmt.Fprintf(stderr, "ignoring %s=%q: not a number; using %d\n", key, v, def)
		return def
	}
	return n
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
