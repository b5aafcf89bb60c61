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

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgdedup/pgdedup/examples/internal/cli"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

// Defaults match docker-compose.yml and a local RabbitMQ with its guest user.
const (
	defaultAMQPURL = "amqp://guest:guest@localhost:5672/"
	defaultQueue   = "orders"
)

func runConsume(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	var cfg consumerConfig
	fs.StringVar(&cfg.DatabaseURL, "database-url", cli.Env("DATABASE_URL", shop.DefaultDatabaseURL), "Postgres URL (env DATABASE_URL)")
	fs.StringVar(&cfg.AMQPURL, "amqp-url", cli.Env("AMQP_URL", defaultAMQPURL), "RabbitMQ URL (env AMQP_URL)")
	fs.StringVar(&cfg.Queue, "queue", cli.Env("QUEUE", defaultQueue), "durable queue to consume (env QUEUE)")
	fs.IntVar(&cfg.Prefetch, "prefetch", envInt("PREFETCH", 32, stderr), "unacked deliveries held at once (env PREFETCH)")
	fs.IntVar(&cfg.Workers, "workers", envInt("WORKERS", 8, stderr), "deliveries processed concurrently (env WORKERS)")
	fs.StringVar(&cfg.Name, "name", host+"-"+strconv.Itoa(os.Getpid()), "consumer name, in charges.charged_by and the AMQP connection name")
	fs.DurationVar(&cfg.LockTimeout, "lock-timeout", 2*time.Second, "requeue a duplicate whose first delivery is still in flight after this long (0 waits)")
	fs.DurationVar(&cfg.HandlerDelay, "handler-delay", 0, "simulated work inside each charge's transaction")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long to wait for deliveries being processed")
	level := fs.String("log-level", "info", "debug logs every delivery's outcome")
	if err := cli.Parse(fs, args, stderr); err != nil {
		return err
	}
	switch {
	case cfg.Prefetch < 1 || cfg.Prefetch > 65535:
		return fmt.Errorf("-prefetch must be between 1 and 65535, got %d", cfg.Prefetch)
	case cfg.Workers < 1:
		return fmt.Errorf("-workers must be at least 1, got %d", cfg.Workers)
	case cfg.Queue == "":
		return errors.New("-queue must not be empty")
	}
	log, err := cli.NewLogger(stderr, *level)
	if err != nil {
		return err
	}
	cfg.Log = log.With("consumer", cfg.Name)
	return consume(ctx, cfg)
}

func runPublish(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("publish", flag.ContinueOnError)
	amqpURL := fs.String("amqp-url", cli.Env("AMQP_URL", defaultAMQPURL), "RabbitMQ URL (env AMQP_URL)")
	queue := fs.String("queue", cli.Env("QUEUE", defaultQueue), "durable queue to publish to (env QUEUE)")
	b := orderBatch{RunID: strconv.FormatInt(time.Now().Unix(), 36)}
	fs.IntVar(&b.Orders, "orders", 1000, "distinct orders to publish")
	fs.Float64Var(&b.Duplicates, "duplicates", 0.2, "share of orders published twice with the same MessageId")
	fs.Float64Var(&b.WithoutID, "without-id", 0.05, "share of orders published without a MessageId (keyed by content)")
	if err := cli.Parse(fs, args, stderr); err != nil {
		return err
	}
	if err := shop.CheckBatch(b.Orders, b.Duplicates, b.WithoutID); err != nil {
		return err
	}
	conn, err := amqp.Dial(*amqpURL)
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := declareQueue(ch, *queue); err != nil {
		return err
	}
	msgs, dups := b.messages(rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())))
	if err := publish(ctx, ch, *queue, msgs); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "published %d messages to %s: %d orders (run %s), %d of them twice\n",
		len(msgs), *queue, b.Orders, b.RunID, dups)
	return nil
}
