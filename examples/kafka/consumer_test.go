package main

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestFailedBatchesAreFetchedAgain runs two consumers in this process whose
// handlers fail a third of their batches after charging: each failed batch
// rolls back and its partition is sought back to the batch, so no record is
// skipped and none is applied twice.
func TestFailedBatchesAreFetchedAgain(t *testing.T) {
	const topic = "orders"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	db := pgdeduptest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	recs, want, _ := orderBatch{RunID: "f", Orders: 600, Duplicates: 0.1, Poison: 2}.records(rand.New(rand.NewPCG(1, 2)), topic)
	if err := produce(ctx, producer, recs); err != nil {
		t.Fatal(err)
	}

	var logs syncBuffer
	consumeCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b"} {
		wg.Go(func() {
			err := consume(consumeCtx, consumerConfig{
				Brokers: cluster.ListenAddrs(), DatabaseURL: db.URL, Topic: topic, Group: "billing", Name: name,
				MaxPollRecords: 20, LockTimeout: 300 * time.Millisecond, FailRate: 0.33,
				SessionTimeout: time.Second, RebalanceTimeout: 5 * time.Second,
				Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With("consumer", name),
			})
			if err != nil {
				t.Errorf("consumer %s: %v", name, err)
			}
		})
	}
	for !drained(t, db, topic, recs) {
		if ctx.Err() != nil {
			stop()
			wg.Wait()
			t.Fatalf("not drained; last log lines:\n%s", tail(logs.String(), 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	wg.Wait()

	checkCharges(t, db, want)
	if n := pgdeduptest.Count(t, db.Pool, "SELECT coalesce(sum(records), 0) FROM records_seen"); n != len(recs) {
		t.Errorf("records applied: %d, want each of the %d records once", n, len(recs))
	}
	failed := strings.Count(logs.String(), "outcome=failed")
	t.Logf("%d records, %d batches failed and were fetched again", len(recs), failed)
	if failed == 0 {
		t.Error("no batch failed: the test tested nothing")
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
