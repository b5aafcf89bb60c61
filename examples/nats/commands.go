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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgdedup/pgdedup/examples/internal/cli"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

// Defaults match docker-compose.yml and a local nats-server -js.
const (
	defaultNATSURL = "nats://127.0.0.1:4222"
	defaultStream  = "ORDERS"
	defaultSubject = "orders.charge"
	defaultDurable = "billing"
	// defaultDupWindow is JetStream's own default for the publish-side
	// duplicate window, made explicit.
	defaultDupWindow = 2 * time.Minute
)

func runConsume(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	var cfg consumerConfig
	fs.StringVar(&cfg.DatabaseURL, "database-url", cli.Env("DATABASE_URL", shop.DefaultDatabaseURL), "Postgres URL (env DATABASE_URL)")
	fs.StringVar(&cfg.NATSURL, "nats-url", cli.Env("NATS_URL", defaultNATSURL), "NATS URL (env NATS_URL)")
	fs.StringVar(&cfg.Stream, "stream", cli.Env("STREAM", defaultStream), "JetStream stream, created if missing (env STREAM)")
	fs.StringVar(&cfg.Subject, "subject", cli.Env("SUBJECT", defaultSubject), "the stream's subject (env SUBJECT)")
	fs.StringVar(&cfg.Durable, "durable", cli.Env("DURABLE", defaultDurable), "durable pull consumer shared by all processes (env DURABLE)")
	fs.StringVar(&cfg.Name, "name", host+"-"+strconv.Itoa(os.Getpid()), "consumer process name, in charges.charged_by and the NATS connection name")
	fs.DurationVar(&cfg.AckWait, "ack-wait", 30*time.Second, "JetStream redelivers a message not acked within this")
	fs.IntVar(&cfg.MaxAckPending, "max-ack-pending", 1000, "messages out unacked at once, over all processes")
	fs.IntVar(&cfg.Batch, "batch", 32, "messages this process buffers ahead")
	fs.IntVar(&cfg.Workers, "workers", 8, "messages processed concurrently")
	fs.DurationVar(&cfg.LockTimeout, "lock-timeout", 2*time.Second, "redeliver a duplicate whose first delivery is still in flight after this long")
	fs.DurationVar(&cfg.HandlerDelay, "handler-delay", 0, "simulated work inside each charge's transaction")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long to wait for messages being processed")
	level := fs.String("log-level", "info", "debug logs every delivery's outcome")
	if err := cli.Parse(fs, args, stderr); err != nil {
		return err
	}
	switch {
	case cfg.Workers < 1:
		return fmt.Errorf("-workers must be at least 1, got %d", cfg.Workers)
	case cfg.Batch < 1:
		return fmt.Errorf("-batch must be at least 1, got %d", cfg.Batch)
	case cfg.MaxAckPending < 1:
		return fmt.Errorf("-max-ack-pending must be at least 1, got %d", cfg.MaxAckPending)
	case cfg.AckWait < time.Second:
		return fmt.Errorf("-ack-wait must be at least 1s, got %s", cfg.AckWait)
	case cfg.LockTimeout <= 0 || cfg.LockTimeout >= cfg.AckWait:
		// Zero would wait on an in-flight duplicate until its first delivery
		// ends, past AckWait, and JetStream would redeliver it once more.
		return fmt.Errorf("-lock-timeout must be above 0 and below -ack-wait (%s), got %s", cfg.AckWait, cfg.LockTimeout)
	case cfg.Stream == "" || cfg.Subject == "" || cfg.Durable == "":
		return errors.New("-stream, -subject and -durable must not be empty")
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
	natsURL := fs.String("nats-url", cli.Env("NATS_URL", defaultNATSURL), "NATS URL (env NATS_URL)")
	stream := fs.String("stream", cli.Env("STREAM", defaultStream), "JetStream stream, created if missing (env STREAM)")
	subject := fs.String("subject", cli.Env("SUBJECT", defaultSubject), "the stream's subject (env SUBJECT)")
	b := orderBatch{RunID: strconv.FormatInt(time.Now().Unix(), 36)}
	fs.IntVar(&b.Orders, "orders", 1000, "distinct orders to publish")
	fs.Float64Var(&b.Duplicates, "duplicates", 0.2, "share of orders published twice with the same Nats-Msg-Id")
	fs.Float64Var(&b.WithoutID, "without-id", 0.05, "share of orders published without a Nats-Msg-Id (keyed by stream sequence)")
	if err := cli.Parse(fs, args, stderr); err != nil {
		return err
	}
	if err := shop.CheckBatch(b.Orders, b.Duplicates, b.WithoutID); err != nil {
		return err
	}
	nc, err := nats.Connect(*natsURL)
	if err != nil {
		return fmt.Errorf("connect to NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := ensureStream(ctx, js, *stream, *subject, defaultDupWindow); err != nil {
		return err
	}
	msgs, dups := b.messages(rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())), *subject)
	stored, dropped, err := publish(ctx, js, msgs)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "published %d messages to %s: %d orders (run %s), %d of them twice; %d stored, %d dropped by JetStream's duplicate window\n",
		len(msgs), *stream, b.Orders, b.RunID, dups, stored, dropped)
	return nil
}
