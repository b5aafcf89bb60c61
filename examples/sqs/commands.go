package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/pgdedup/pgdedup/examples/internal/cli"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

const defaultKeyAttribute = "idempotency-key"

// queueFlags are the flags naming the SQS endpoint and queue.
type queueFlags struct {
	endpoint, url, name string
}

func (q *queueFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&q.endpoint, "endpoint", cli.Env("SQS_ENDPOINT", ""), "SQS endpoint URL of a local SQS-compatible server; empty for AWS (env SQS_ENDPOINT)")
	fs.StringVar(&q.url, "queue-url", cli.Env("QUEUE_URL", ""), "queue URL (env QUEUE_URL)")
	fs.StringVar(&q.name, "queue", cli.Env("QUEUE", "orders"), "queue name, when -queue-url is empty (env QUEUE)")
}

func runConsume(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	var cfg consumerConfig
	var q queueFlags
	q.register(fs)
	fs.StringVar(&cfg.DatabaseURL, "database-url", cli.Env("DATABASE_URL", shop.DefaultDatabaseURL), "Postgres URL (env DATABASE_URL)")
	fs.StringVar(&cfg.KeyAttribute, "key-attribute", cli.Env("KEY_ATTRIBUTE", defaultKeyAttribute), "message attribute with the producer's idempotency key; without it a message is keyed by its SQS MessageId (env KEY_ATTRIBUTE)")
	fs.StringVar(&cfg.Name, "name", host+"-"+strconv.Itoa(os.Getpid()), "consumer name, in charges.charged_by")
	fs.IntVar(&cfg.Pollers, "pollers", 4, "concurrent long polls, each charging its batch")
	fs.IntVar(&cfg.BatchSize, "batch", 10, "messages per receive, 1 to 10")
	fs.DurationVar(&cfg.Wait, "wait", 20*time.Second, "long-poll wait, 0 to 20s")
	fs.DurationVar(&cfg.LockTimeout, "lock-timeout", 2*time.Second, "requeue a message whose key is in flight elsewhere after this long (0 waits); keep it well under the visibility timeout")
	fs.DurationVar(&cfg.Retention, "retention", defaultRetention, "how long a key is remembered: beyond the queue's MessageRetentionPeriod (at most 14 days)")
	fs.DurationVar(&cfg.RequeueDelay, "requeue-delay", time.Second, "visibility timeout given to a message that was in flight elsewhere or failed (whole seconds)")
	fs.DurationVar(&cfg.HandlerDelay, "handler-delay", 0, "simulated work inside each batch's transaction")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long to wait for batches being processed")
	level := fs.String("log-level", "info", "debug logs every message's outcome")
	if err := cli.Parse(fs, args, stderr); err != nil {
		return err
	}
	switch {
	case cfg.Pollers < 1:
		return fmt.Errorf("-pollers must be at least 1, got %d", cfg.Pollers)
	case cfg.BatchSize < 1 || cfg.BatchSize > 10:
		return fmt.Errorf("-batch must be between 1 and 10 (the SQS maximum), got %d", cfg.BatchSize)
	case cfg.Wait < 0 || cfg.Wait > 20*time.Second:
		return fmt.Errorf("-wait must be between 0 and 20s (the SQS maximum), got %s", cfg.Wait)
	case cfg.RequeueDelay < 0 || cfg.RequeueDelay > 12*time.Hour:
		return fmt.Errorf("-requeue-delay must be between 0 and 12h (the SQS maximum), got %s", cfg.RequeueDelay)
	case cfg.KeyAttribute == "":
		return errors.New("-key-attribute must not be empty")
	}
	log, err := cli.NewLogger(stderr, *level)
	if err != nil {
		return err
	}
	cfg.Log = log.With("consumer", cfg.Name)
	cfg.Endpoint = q.endpoint
	client, err := newClient(ctx, q.endpoint)
	if err != nil {
		return err
	}
	if cfg.QueueURL, err = queueURL(ctx, client, q.url, q.name); err != nil {
		return err
	}
	return consume(ctx, cfg)
}

func runCreateQueue(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("create-queue", flag.ContinueOnError)
	var q queueFlags
	q.register(fs)
	spec := queueSpec{}
	fs.IntVar(&spec.VisibilityTimeout, "visibility-timeout", 30, "seconds a received message stays hidden from other consumers")
	fs.IntVar(&spec.MaxReceiveCount, "max-receive-count", 5, "receives after which a message moves to the dead-letter queue")
	if err := cli.Parse(fs, args, stderr); err != nil {
		return err
	}
	spec.Name = q.name
	switch {
	case spec.Name == "":
		return errors.New("-queue must not be empty")
	case spec.VisibilityTimeout < 0 || spec.VisibilityTimeout > 43200:
		return fmt.Errorf("-visibility-timeout must be between 0 and 43200 seconds, got %d", spec.VisibilityTimeout)
	case spec.MaxReceiveCount < 1 || spec.MaxReceiveCount > 1000:
		return fmt.Errorf("-max-receive-count must be between 1 and 1000, got %d", spec.MaxReceiveCount)
	}
	client, err := newClient(ctx, q.endpoint)
	if err != nil {
		return err
	}
	url, dlq, err := createQueue(ctx, client, spec)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "queue %s\ndead-letter queue %s\n", url, dlq)
	return nil
}

func runSend(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	var q queueFlags
	q.register(fs)
	b := orderBatch{RunID: strconv.FormatInt(time.Now().Unix(), 36)}
	fs.StringVar(&b.KeyAttribute, "key-attribute", cli.Env("KEY_ATTRIBUTE", defaultKeyAttribute), "message attribute carrying the idempotency key (env KEY_ATTRIBUTE)")
	fs.IntVar(&b.Orders, "orders", 1000, "distinct orders to send")
	fs.Float64Var(&b.Duplicates, "duplicates", 0.2, "share of keyed orders sent twice with the same key")
	fs.Float64Var(&b.WithoutKey, "without-key", 0.05, "share of orders sent without a key (keyed by SQS MessageId, never sent twice)")
	if err := cli.Parse(fs, args, stderr); err != nil {
		return err
	}
	if err := shop.CheckBatch(b.Orders, b.Duplicates, b.WithoutKey); err != nil {
		return err
	}
	if b.KeyAttribute == "" {
		return errors.New("-key-attribute must not be empty")
	}
	client, err := newClient(ctx, q.endpoint)
	if err != nil {
		return err
	}
	url, err := queueURL(ctx, client, q.url, q.name)
	if err != nil {
		return err
	}
	msgs, dups := b.messages(rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())))
	if err := send(ctx, client, url, b.KeyAttribute, msgs); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "sent %d messages to %s: %d orders (run %s), %d of them twice\n", len(msgs), url, b.Orders, b.RunID, dups)
	return nil
}

// runLambda serves Lambda invocations through the runtime API until the
// execution environment is shut down. Lambda passes no arguments, so its
// settings are environment variables.
func runLambda(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lambda", flag.ContinueOnError)
	dbURL := fs.String("database-url", cli.Env("DATABASE_URL", shop.DefaultDatabaseURL), "Postgres URL (env DATABASE_URL)")
	keyAttr := fs.String("key-attribute", cli.Env("KEY_ATTRIBUTE", defaultKeyAttribute), "message attribute with the producer's idempotency key (env KEY_ATTRIBUTE)")
	lockTimeout := fs.Duration("lock-timeout", envDuration("LOCK_TIMEOUT", 2*time.Second, stderr), "report a message whose key is in flight elsewhere as failed after this long (env LOCK_TIMEOUT)")
	name := fs.String("name", cli.Env("AWS_LAMBDA_FUNCTION_NAME", "lambda"), "recorded in charges.charged_by (env AWS_LAMBDA_FUNCTION_NAME)")
	retention := fs.Duration("retention", envDuration("RETENTION", defaultRetention, stderr), "how long a key is remembered: beyond the queue's MessageRetentionPeriod (env RETENTION)")
	handlerDelay := fs.Duration("handler-delay", envDuration("HANDLER_DELAY", 0, stderr), "simulated work inside each batch's transaction (env HANDLER_DELAY)")
	level := fs.String("log-level", cli.Env("LOG_LEVEL", "info"), "debug logs every message's outcome (env LOG_LEVEL)")
	if err := cli.Parse(fs, args, stderr); err != nil {
		return err
	}
	if os.Getenv("AWS_LAMBDA_RUNTIME_API") == "" {
		return errors.New("AWS_LAMBDA_RUNTIME_API is not set: this command runs inside Lambda (or a runtime interface emulator)")
	}
	if *keyAttr == "" {
		return errors.New("-key-attribute must not be empty")
	}
	log, err := cli.NewLogger(stderr, *level)
	if err != nil {
		return err
	}
	log = log.With("consumer", *name)
	// One pool per execution environment, reused by every invocation; one
	// connection is enough: Lambda sends it one event at a time.
	pool, store, err := openStore(ctx, *dbURL, *name, 1, *lockTimeout, *retention, log)
	if err != nil {
		return err
	}
	defer pool.Close()
	h := &lambdaHandler{keyAttribute: *keyAttr, charger: &charger{store: store, name: *name, handlerDelay: *handlerDelay, log: log}}
	lambda.StartWithOptions(h.Handle, lambda.WithContext(ctx))
	return nil // not reached: lambda.Start exits the process
}

// envDuration is [cli.Env] for durations; a malformed value falls back to def
// with a warning rather than silently becoming 0.
func envDuration(key string, def time.Duration, stderr io.Writer) time.Duration {
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		fmt.Fprintf(stderr, "ignoring %s=%q: not a duration; using %s\n", key, v, def)
		return def
	}
	return d
}
