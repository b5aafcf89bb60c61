package citus

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgdedup/pgdedup"
)

// broker delivers message IDs at least once to concurrent consumers, like a
// queue: every ID is delivered twice (the copy at a random later point, often
// while the first is in flight), and a delivery whose handler fails is
// delivered again after a short pause, as a nack would be.
type broker struct {
	mu      sync.Mutex
	pending []string // deliveries waiting for a consumer
	ids     []string // every ID published, once each
	next    int      // the next ID number to publish

	busy     atomic.Int64 // deliveries being handled
	acked    atomic.Int64 // deliveries handled without error
	failures atomic.Int64 // deliveries that failed and were delivered again
	// permanent counts the failures pgdedup.IsTransient does not call
	// transient: a consumer following the docs would dead-letter them.
	permanent atomic.Int64
	lastErr   atomic.Value // the last failure, for the log

	errMu  sync.Mutex
	errors map[string]int // failures by message, for the log
}

// failed records a failed delivery's error.
func (b *broker) failed(err error) {
	b.errMu.Lock()
	defer b.errMu.Unlock()
	if b.errors == nil {
		b.errors = map[string]int{}
	}
	key := err.Error()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) { // without the message ID, so alike failures add up
		key = pgErr.Code + " " + pgErr.Message
	}
	b.errors[key]++
}

// errorSummary returns the distinct failures and how often each happened.
func (b *broker) errorSummary() string {
	b.errMu.Lock()
	defer b.errMu.Unlock()
	var out []string
	for msg, n := range b.errors {
		out = append(out, fmt.Sprintf("%d× %s", n, msg))
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// publish adds n new IDs, each delivered twice.
func (b *broker) publish(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for range n {
		id := fmt.Sprintf("msg-%07d", b.next)
		b.next++
		b.ids = append(b.ids, id)
		b.pending = append(b.pending, id)
		// The duplicate lands somewhere among the next deliveries.
		at := len(b.pending) - rand.N(min(len(b.pending), 16))
		b.pending = append(b.pending[:at], append([]string{id}, b.pending[at:]...)...)
	}
}

// take returns up to n pending deliveries, counted busy until handled.
func (b *broker) take(n int) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	n = min(n, len(b.pending))
	if n == 0 {
		return nil
	}
	ids := slices.Clone(b.pending[:n])
	b.pending = b.pending[n:]
	b.busy.Add(1)
	return ids
}

func (b *broker) redeliver(ids []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pending = append(b.pending, ids...)
}

// backlog returns how many deliveries wait for a consumer.
func (b *broker) backlog() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}

// published returns the IDs published so far.
func (b *broker) published() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.ids...)
}

// run runs consumers goroutines calling handle for deliveries until feed
// returns false and every delivery was acked, or ctx ends (then it returns
// ctx's error). Consumer c takes batch(c) deliveries at a time (nil batch:
// one). feed is called between deliveries by one goroutine at a time: it may
// publish more and reports whether more may come.
func (b *broker) run(ctx context.Context, consumers int, batch func(c int) int, feed func() bool,
	handle func(ctx context.Context, c int, ids []string) error) error {
	var feeding sync.Mutex
	more := feed != nil
	var wg sync.WaitGroup
	for c := range consumers {
		size := 1
		if batch != nil {
			size = batch(c)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				feeding.Lock()
				if more {
					more = feed()
				}
				done := !more
				feeding.Unlock()
				ids := b.take(size)
				if ids == nil {
					if done && b.idle() {
						return
					}
					time.Sleep(5 * time.Millisecond)
					continue
				}
				err := handle(ctx, c, ids)
				if err != nil {
					b.failures.Add(int64(len(ids)))
					if !pgdedup.IsTransient(err) {
						b.permanent.Add(int64(len(ids)))
					}
					b.lastErr.Store(err.Error())
					b.failed(err)
					time.Sleep(20 * time.Millisecond)
					b.redeliver(ids)
				} else {
					b.acked.Add(int64(len(ids)))
				}
				b.busy.Add(-1)
			}
		}()
	}
	wg.Wait()
	return ctx.Err()
}

// idle reports whether nothing is pending and no delivery is being handled.
func (b *broker) idle() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending) == 0 && b.busy.Load() == 0
}
