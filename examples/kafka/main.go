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
	"io"
	"os"

	"github.com/pgdedup/pgdedup/examples/internal/cli"
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
func runWithSignals(args []string) int { return cli.WithSignals(run, args) }

// run dispatches to a command and returns the exit code: 0 on success, 1 on
// failure, 2 on bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Run(ctx, "kafka", usage, map[string]cli.Command{
		"consume": runConsume,
		"produce": runProduce,
		"compare": runCompare,
	}, args, stdout, stderr)
}
