package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

// consumerConfig is what one consumer process needs; main fills it from flags
// and environment variables.
type consumerConfig struct {
	Brokers          []string
	DatabaseURL      string
	Topic            string
	Group            string
	Name             string        // this process, recorded in charges.charged_by and as the Kafka client ID
	MaxPollRecords   int           // records taken per poll, over all partitions
	LockTimeout      time.Duration // pgdedup.Config.LockTimeout: give up on a partition another transaction holds
	HandlerDelay     time.Duration // simulated work per batch inside the transaction, after the charges
	SessionTimeout   time.Duration // Kafka group session timeout: how soon a dead consumer's partitions move
	RebalanceTimeout time.Duration // how long a rebalance waits for members to rejoin
	Rewind           bool          // ignore the database's offsets and read every assigned partition from the start
	FailRate         float64       // share of batches whose handler fails after charging (a payment service error, say)
	Log              *slog.Logger
	ClientOpts       []kgo.Opt // extra franz-go options (TLS, SASL) for a real cluster
}

// consumer charges orders from a Kafka topic, each once: every batch of a
// partition runs in pgdedup's Store.ProcessOffsets, which advances the
// partition's offset in processed_offsets in the same transaction as the
// charges. Kafka's committed offsets are not used.
type consumer struct {
	cfg   consumerConfig
	store *pgdedup.Store
	cl    *kgo.Client
	ready chan struct{} // closed once cl is set: franz-go may call resume before NewClient returns
	stats stats

	mu          sync.Mutex
	generations map[string]map[int32]int64 // the group generation each partition was assigned in: its fencing token
}

// errPaymentService is the failure -fail-rate simulates.
var errPaymentService = errors.New("payment service unavailable (simulated)")

// consume runs a consumer until ctx is cancelled (SIGTERM). It finishes the
// batches it is processing, then leaves the group.
func consume(ctx context.Context, cfg consumerConfig) error {
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("database URL: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("connect to Postgres: %w", err)
	}
	defer pool.Close()
	if err := migrate(ctx, pool); err != nil {
		if ctx.Err() != nil { // SIGTERM while starting: nothing was consumed
			cfg.Log.Info("stopped while starting")
			return nil
		}
		return err
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: cfg.Group, LockTimeout: cfg.LockTimeout, Logger: cfg.Log})
	if err != nil {
		return err
	}
	c := &consumer{cfg: cfg, store: store, ready: make(chan struct{}), generations: map[string]map[int32]int64{}}

	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.Name),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topic),
		// The offset lives in Postgres, committed with the charges. Committing
		// to Kafka as well could only be ahead of or behind the truth.
		kgo.DisableAutoCommit(),
		// A partition with no offset in Postgres has never been processed.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Records of aborted producer transactions are never handed over.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Rebalances are not held back (BlockRebalanceOnPoll would hold them
		// while a poll waits for records): a partition may change hands
		// while a batch of it is in a transaction here. The new owner's claim
		// then waits for this transaction's row lock and skips what it
		// committed, or ErrFenced stops this one if the new owner was first.
		// Runs on every assignment, after Kafka's offsets are fetched and
		// before any record is: replace them with the database's.
		kgo.AdjustFetchOffsetsFn(c.resume),
		kgo.OnPartitionsRevoked(c.revoked("revoked")),
		kgo.OnPartitionsLost(c.revoked("lost")),
		kgo.SessionTimeout(cfg.SessionTimeout),
		kgo.HeartbeatInterval(cfg.SessionTimeout / 5),
		kgo.RebalanceTimeout(cfg.RebalanceTimeout),
	}, cfg.ClientOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	c.cl = cl
	close(c.ready)
	defer cl.Close()
	cfg.Log.Info("consuming", "topic", cfg.Topic, "group", cfg.Group, "brokers", cfg.Brokers, "rewind", cfg.Rewind)

	// Batches already started are finished after SIGTERM, not abandoned.
	workCtx := context.WithoutCancel(ctx)
	for {
		fetches := cl.PollRecords(ctx, cfg.MaxPollRecords)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			break
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			cfg.Log.Warn("fetch error", "topic", topic, "partition", partition, "error", err)
		})
		c.process(workCtx, fetches)
	}
	c.stats.log(cfg.Log, "stopped")
	return nil
}

// resume is the AdjustFetchOffsetsFn: for every newly assigned partition it
// looks up the database's offset, seeks there, and notes the generation the
// partition was assigned in, the fencing token of its claims.
func (c *consumer) resume(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	select {
	case <-c.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	_, gen := c.cl.GroupMetadata()
	assigned := map[string][]int32{}
	for topic, parts := range offsets {
		for p := range parts {
			assigned[topic] = append(assigned[topic], p)
		}
	}
	stored, err := c.store.ResumeOffsets(ctx, assigned)
	if err != nil {
		// The group session ends and is joined again: no record of these
		// partitions is processed before their offsets are known.
		c.cfg.Log.Error("reading offsets on assignment", "error", err)
		return nil, err
	}
	c.mu.Lock()
	for topic, parts := range assigned {
		if c.generations[topic] == nil {
			c.generations[topic] = map[int32]int64{}
		}
		for _, p := range parts {
			c.generations[topic][p] = int64(gen)
			if next, ok := stored[topic][p]; ok && !c.cfg.Rewind {
				offsets[topic][p] = kgo.NewOffset().At(next).WithEpoch(-1)
			} else if c.cfg.Rewind {
				offsets[topic][p] = kgo.NewOffset().AtStart()
			}
		}
	}
	c.mu.Unlock()
	c.cfg.Log.Info("assigned", "partitions", assigned, "generation", gen, "resume", stored)
	return offsets, nil
}

func (c *consumer) revoked(how string) func(context.Context, *kgo.Client, map[string][]int32) {
	return func(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
		c.cfg.Log.Info("partitions "+how, "partitions", parts)
	}
}

func (c *consumer) generation(topic string, partition int32) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.generations[topic][partition]
}

// process handles one poll: each partition's records, in offset order, as one
// batch, the partitions concurrently. A partition whose batch failed is sought
// back to the batch's first offset, so that no record is skipped: what had
// committed before is skipped by the offset check when it comes again. A
// fenced partition is not: it belongs to a newer generation.
func (c *consumer) process(ctx context.Context, fetches kgo.Fetches) {
	type tp struct {
		topic     string
		partition int32
	}
	batches := map[tp][]*kgo.Record{}
	var order []tp
	fetches.EachRecord(func(r *kgo.Record) {
		k := tp{r.Topic, r.Partition}
		if batches[k] == nil {
			order = append(order, k)
		}
		batches[k] = append(batches[k], r)
	})
	var wg sync.WaitGroup
	var mu sync.Mutex
	rewind := map[string]map[int32]kgo.EpochOffset{}
	for _, k := range order {
		recs := batches[k]
		wg.Go(func() {
			err := c.handle(ctx, k.topic, k.partition, recs)
			// Kafka has no dead-letter queue (fn commits a poison record
			// without a charge): a batch that failed is fetched again,
			// unless a newer generation owns the partition (ActionStop,
			// ErrFenced), whose consumer resumes it.
			if err != nil && pgdedup.ActionFor(err) != pgdedup.ActionStop {
				mu.Lock()
				if rewind[k.topic] == nil {
					rewind[k.topic] = map[int32]kgo.EpochOffset{}
				}
				rewind[k.topic][k.partition] = kgo.EpochOffset{Epoch: -1, Offset: recs[0].Offset}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(rewind) > 0 {
		c.cl.SetOffsets(rewind) // from the polling goroutine; a partition revoked meanwhile is skipped
	}
}

// handle processes one partition's batch: one transaction that charges the
// fresh records and advances the partition's offset.
func (c *consumer) handle(ctx context.Context, topic string, partition int32, recs []*kgo.Record) error {
	start := time.Now()
	p := pgdedup.TopicPartition{Topic: topic, Partition: partition, Generation: c.generation(topic, partition)}
	offsets := make([]int64, len(recs))
	byOffset := make(map[int64]record, len(recs))
	for i, r := range recs {
		offsets[i] = r.Offset
		o, err := shop.DecodeOrder(r.Value)
		byOffset[r.Offset] = record{offset: r.Offset, order: o, bad: err}
	}
	var res chargeResult
	fresh, err := c.store.ProcessOffsets(ctx, p, offsets, func(ctx context.Context, tx pgx.Tx, fresh []int64) error {
		recs := make([]record, len(fresh))
		for i, o := range fresh {
			recs[i] = byOffset[o]
		}
		var err error
		if res, err = chargeBatch(ctx, tx, topic, partition, c.cfg.Name, recs); err != nil {
			return err
		}
		time.Sleep(c.cfg.HandlerDelay) // the call to the payment service, say
		if c.cfg.FailRate > 0 && rand.Float64() < c.cfg.FailRate {
			return errPaymentService
		}
		return nil
	})
	outcome := "processed"
	switch pgdedup.ActionFor(err) {
	case pgdedup.ActionAck:
		if len(fresh) == 0 {
			outcome = "duplicate"
		}
	case pgdedup.ActionStop: // ErrFenced: a newer generation owns the partition
		outcome = "fenced"
		c.stats.fenced.Add(1)
	case pgdedup.ActionRequeue:
		outcome = "failed"
		if errors.Is(err, pgdedup.ErrInFlight) {
			outcome = "in_flight"
			c.stats.inFlight.Add(1)
		} else {
			c.stats.failed.Add(1)
		}
	case pgdedup.ActionDeadLetter: // fn's own error, such as errPaymentService
		outcome = "failed"
		c.stats.failed.Add(1)
	}
	skipped := 0
	if err == nil {
		skipped = len(recs) - len(fresh)
		c.stats.records.Add(int64(len(recs)))
		c.stats.skipped.Add(int64(skipped))
		c.stats.charged.Add(int64(res.charged))
		c.stats.producedTwice.Add(int64(res.producedTwice))
		c.stats.rejected.Add(int64(res.rejected))
	}
	level := slog.LevelDebug
	if err != nil {
		level = slog.LevelWarn
	}
	c.cfg.Log.Log(ctx, level, "batch", "topic", topic, "partition", partition, "generation", p.Generation,
		"first", offsets[0], "last", offsets[len(offsets)-1], "records", len(recs), "skipped", skipped,
		"charged", res.charged, "produced_twice", res.producedTwice, "rejected", res.rejected,
		"outcome", outcome, "took", time.Since(start).Round(time.Microsecond), "error", err)
	return err
}
