// Command sqs is an SQS consumer, and a Lambda function for SQS events, that
// charge each order exactly once however often SQS delivers it: each batch
// runs in pgdedup's Store.ProcessBatch, which records the messages' keys in the
// same transaction as the charges, and a message is deleted only after that
// transaction commits.
//
//	sqs migrate        create processed_messages and charges
//	sqs create-queue   create the queue and its dead-letter queue
//	sqs consume        long-poll the queue and charge orders until SIGTERM
//	sqs send           send demo orders, some of them twice
//	sqs lambda         the Lambda function (also run when Lambda starts the
//	                   binary as bootstrap, without arguments)
//
// Settings come from flags, or else from DATABASE_URL, SQS_ENDPOINT,
// QUEUE_URL, QUEUE and KEY_ATTRIBUTE; AWS credentials and region as for the
// AWS CLI. See README.md.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgdedup/pgdedup/examples/internal/cli"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

const usage = `usage: sqs <command> [flags]

commands:
  migrate        create processed_messages and the charges table (idempotent)
  create-queue   create the queue, its dead-letter queue and the redrive policy
  consume        long-poll the queue and charge orders until SIGTERM or Ctrl-C
  send           send demo orders to the queue, a share of them twice
  lambda         serve Lambda invocations for SQS events (in a Lambda runtime)

Run "sqs <command> -h" for the command's flags.
`

func main() {
	args := os.Args[1:]
	if len(args) == 0 && os.Getenv("AWS_LAMBDA_RUNTIME_API") != "" {
		args = []string{"lambda"} // started by Lambda as bootstrap
	}
	os.Exit(runWithSignals(args))
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
	return cli.Run(ctx, "sqs", usage, map[string]cli.Command{
		"migrate":      shop.RunMigrate,
		"create-queue": runCreateQueue,
		"consume":      runConsume,
		"send":         runSend,
		"lambda":       runLambda,
	}, args, stdout, stderr)
}
