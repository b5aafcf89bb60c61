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
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgdedup/pgdedup/examples/internal/cli"
)

// Defaults match docker-compose.yml and a local single-broker Kafka.
const (
	defaultDatabaseURL = "postgres://postgres@localhost:5432/postgres?sslmode=disable"
	defaultBrokers     = "localhost:9092"
	defaultTopic       = "orders"
	defaultGroup       = "billing"
)

func runConsume(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	var cfg consumerConfig
	brokers := fs.String("brokers", cli.Env("KAFKA_BROKERS", defaultBrokers), "comma-separated seed brokers (env KAFKA_BROKERS)")
	fs.StringVar(&cfg.DatabaseURL, "database-url", cli.Env("DATABASE_URL", defaultDatabaseURL), "Postgres URL (env DATABASE_URL)")
	fs.StringVar(&cfg.Topic, "topic", cli.Env("TOPIC", defaultTopic), "topic to consume (env TOPIC)")
	fs.StringVar(&cfg.Group, "group", cli.Env("GROUP", defaultGroup), "consumer group, also pgdedup's consumer name (env GROUP)")
	fs.StringVar(&cfg.Name, "name", host+"-"+strconv.Itoa(os.Getpid()), "consumer name, in charges.charged_by and the Kafka client ID")
	fs.IntVar(&cfg.MaxPollRecords, "max-poll-records", 500, "records taken per poll, over all partitions")
	fs.DurationVar(&cfg.LockTimeout, "lock-timeout", 2*time.Second, "give up on a partition another transaction holds after this long, and fetch it again (0 waits)")
	fs.DurationVar(&cfg.HandlerDelay, "handler-delay", 0, "simulated work in each batch's transaction")
	fs.DurationVar(&cfg.SessionTimeout, "session-timeout", 45*time.Second, "Kafka group session timeout")
	fs.DurationVar(&cfg.RebalanceTimeout, "rebalance-timeout", time.Minute, "how long a rebalance waits for members to rejoin")
	fs.Float64Var(&cfg.FailRate, "fail-rate", 0, "share of batches whose handler fails after charging (rolled back, fetched again)")
	fs.BoolVar(&cfg.Rewind, "rewind", false, "ignore the database's offsets and read every assigned partition from the start (to watch the offset check skip)")
	level := fs.String("log-level", "info", "debug logs every batch's outcome")
	if err := cli.Parse(fs, args, stderr); err != nil {
		return err
	}
	cfg.Brokers = splitList(*brokers)
	switch {
	case len(cfg.Brokers) == 0:
		return errors.New("-brokers must name at least one broker")
	case cfg.Topic == "":
		return errors.New("-topic must not be empty")
	case cfg.Group == "":
		return errors.New("-group must not be empty")
	case cfg.MaxPollRecords < 1:
		return fmt.Errorf("-max-poll-records must be at least 1, got %d", cfg.MaxPollRecords)
	case cfg.SessionTimeout < 100*time.Millisecond:
		return fmt.Errorf("-session-timeout must be at least 100ms, got %s", cfg.SessionTimeout)
	case cfg.FailRate < 0 || cfg.FailRate > 0.9:
		return fmt.Errorf("-fail-rate must be between 0 and 0.9, got %g", cfg.FailRate)
	case cfg.RebalanceTimeout < time.Second:
		return fmt.Errorf("-rebalance-timeout must be at least 1s, got %s", cfg.RebalanceTimeout)
	}
	log, err := cli.NewLogger(stderr, *level)
	if err != nil {
		return err
	}
	cfg.Log = log.With("consumer", cfg.Name)
	return consume(ctx, cfg)
}

func runProduce(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("produce", flag.ContinueOnError)
	brokers := fs.String("brokers", cli.Env("KAFKA_BROKERS", defaultBrokers), "comma-separated seed brokers (env KAFKA_BROKERS)")
	topic := fs.String("topic", cli.Env("TOPIC", defaultTopic), "topic to produce to (env TOPIC)")
	b := orderBatch{RunID: strconv.FormatInt(time.Now().Unix(), 36)}
	fs.IntVar(&b.Orders, "orders", 1000, "distinct orders to produce")
	fs.Float64Var(&b.Duplicates, "duplicates", 0.1, "share of orders produced twice (two records, two offsets)")
	fs.IntVar(&b.Poison, "poison", 0, "unparseable records mixed in")
	if err := cli.Parse(fs, args, stderr); err != nil {
		return err
	}
	switch {
	case b.Orders < 1:
		return fmt.Errorf("-orders must be at least 1, got %d", b.Orders)
	case b.Duplicates < 0 || b.Duplicates > 1:
		return fmt.Errorf("-duplicates must be between 0 and 1, got %g", b.Duplicates)
	case b.Poison < 0:
		return fmt.Errorf("-poison must not be negative, got %d", b.Poison)
	case len(splitList(*brokers)) == 0:
		return errors.New("-brokers must name at least one broker")
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(splitList(*brokers)...))
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	recs, _, dups := b.records(rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())), *topic)
	if err := produce(ctx, cl, recs); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "produced %d records to %s: %d orders (run %s), %d of them twice, %d unparseable\n",
		len(recs), *topic, b.Orders, b.RunID, dups, b.Poison)
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
