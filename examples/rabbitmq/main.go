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
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/pgdedup/pgdedup/examples/internal/cli"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
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
func runWithSignals(args []string) int { return cli.WithSignals(run, args) }

// run dispatches to a command and returns the exit code: 0 on success, 1 on
// failure, 2 on bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Run(ctx, "rabbitmq", usage, map[string]cli.Command{
		"migrate": shop.RunMigrate,
		"consume": runConsume,
		"publish": runPublish,
	}, args, stdout, stderr)
}

// envInt is [cli.Env] for numbers; a malformed value falls back to def with a
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
