// Command nats is a NATS JetStream consumer that charges each order exactly
// once, however often JetStream delivers it: a durable pull consumer with
// explicit acks, each message run in pgdedup's Store.Process (the message ID
// recorded in the same transaction as the charge) and acked only after that
// transaction commits.
//
//	nats migrate   create processed_messages and charges
//	nats consume   charge orders from the stream until SIGTERM
//	nats publish   send demo orders, some of them twice
//
// Settings come from flags, or else from DATABASE_URL, NATS_URL, STREAM,
// SUBJECT and DURABLE. See README.md.
package main

import (
	"context"
	"io"
	"os"

	"github.com/pgdedup/pgdedup/examples/internal/cli"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

const usage = `usage: nats <command> [flags]

commands:
  migrate   create processed_messages and the charges table (idempotent)
  consume   charge orders from the stream until SIGTERM or Ctrl-C
  publish   send demo orders to the stream, a share of them twice

Run "nats <command> -h" for the command's flags.
`

func main() {
	os.Exit(runWithSignals(os.Args[1:]))
}

// runWithSignals runs the command until it ends or SIGTERM/SIGINT cancels it.
func runWithSignals(args []string) int { return cli.WithSignals(run, args) }

// run dispatches to a command and returns the exit code: 0 on success, 1 on
// failure, 2 on bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Run(ctx, "nats", usage, map[string]cli.Command{
		"migrate": shop.RunMigrate,
		"consume": runConsume,
		"publish": runPublish,
	}, args, stdout, stderr)
}
