package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// BenchmarkDatabaseBounds measures what keyed requests hold while their
// handler is slow (issue 22 §3), as counts, one scenario per sub-benchmark;
// run it with -benchtime=1x. Each scenario blocks the handler until the
// measurement is taken, then releases it:
//
//   - slow-handlers: a pool of 4 and 5 requests with distinct keys; reported:
//     connections the middleware held at most, how many of 5 health probes
//     (SELECT 1 with a 500 ms deadline) got a connection meanwhile, and how
//     many requests were turned away with 503 while the handlers stayed slow
//     for longer than DefaultAcquireTimeout;
//   - same-key: one request and 11 duplicates of its key (InFlightWait 1 min);
//     reported: connections held at most;
//   - queued-bodies: 200 requests with 1 MiB bodies behind a slow one;
//     reported: heap in use while they wait, in MiB.
//
// newBoundsMiddleware (bench_bounds_cfg_test.go) builds the middleware, so
// that the same scenarios can run against an earlier Config.
func BenchmarkDatabaseBounds(b *testing.B) {
	b.Run("slow-handlers", func(b *testing.B) {
		for b.Loop() {
			s := newBoundsServer(b, 4, 0)
			replies := s.fire(5, func(i int) string { return fmt.Sprint("k", i) }, order)
			s.settle()
			held := s.peak.Load() // before the probes take their own
			healthy := 0
			for range 5 {
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				var one int
				if s.pool.QueryRow(ctx, `SELECT 1`).Scan(&one) == nil {
					healthy++
				}
				cancel()
			}
			time.Sleep(idempotency.DefaultAcquireTimeout) // longer than a turn is waited for
			s.stop()
			busy := 0
			for range 5 {
				if r := <-replies; r.status == 503 {
					busy++
				}
			}
			b.ReportMetric(float64(held), "held-conns")
			b.ReportMetric(float64(healthy), "health-ok/5")
			b.ReportMetric(float64(busy), "busy-503/5")
		}
	})
	b.Run("same-key", func(b *testing.B) {
		for b.Loop() {
			s := newBoundsServer(b, 20, time.Minute)
			replies := s.fire(12, func(int) string { return "same" }, order)
			s.settle()
			peak := s.stop()
			for range 12 {
				<-replies
			}
			b.ReportMetric(float64(peak), "held-conns")
		}
	})
	b.Run("queued-bodies", func(b *testing.B) {
		for b.Loop() {
			s := newBoundsServer(b, 4, 0)
			var before runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			body := `{"order":"o-1","amount":500}` + strings.Repeat(" ", 1<<20-40)
			replies := s.fire(200, func(i int) string { return fmt.Sprint("k", i) }, body)
			s.settle()
			s.settle() // 200 MiB to send on a busy machine
			s.settle()
			var during runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&during)
			s.stop()
			for range 200 {
				<-replies
			}
			b.ReportMetric(float64(int64(during.HeapInuse)-int64(before.HeapInuse))/(1<<20), "heap-MiB")
		}
	})
}

type boundsServer struct {
	b      *testing.B
	pool   *pgxpool.Pool
	url    string
	gate   chan struct{}
	peak   atomic.Int32
	done   chan struct{}
	sample sync.WaitGroup
}

// newBoundsServer serves the charge API, whose handler waits for gate to
// close, through a middleware on a pool of maxConns.
func newBoundsServer(b *testing.B, maxConns int32, inFlightWait time.Duration) *boundsServer {
	db := pgtest.New(b)
	pgtest.Exec(b, db.Pool, `CREATE TABLE charges (id bigserial PRIMARY KEY, order_id text NOT NULL, amount int NOT NULL)`)
	pool := pgtest.Pool(b, db.URL, maxConns)
	s := &boundsServer{b: b, pool: pool, gate: make(chan struct{}), done: make(chan struct{})}
	mw, err := newBoundsMiddleware(pool, inFlightWait)
	if err != nil {
		b.Fatal(err)
	}
	api := &chargeAPI{gate: s.gate}
	srv := httptest.NewServer(authenticate(mw.Wrap(api)))
	b.Cleanup(srv.Close)
	s.url = srv.URL
	s.sample.Go(func() {
		for {
			select {
			case <-s.done:
				return
			case <-time.After(time.Millisecond):
			}
			if n := pool.Stat().AcquiredConns(); n > s.peak.Load() {
				s.peak.Store(n)
			}
		}
	})
	return s
}

// fire sends n requests at once, the i-th with key(i).
func (s *boundsServer) fire(n int, key func(i int) string, body string) <-chan reply {
	replies := make(chan reply, n)
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: n}}
	for i := range n {
		go func() {
			r, err := sendWith(client, s.url, key(i), body)
			if err != nil {
				r.status = -1
			}
			replies <- r
		}()
	}
	return replies
}

// settle lets the requests reach where they wait.
func (s *boundsServer) settle() { time.Sleep(time.Second) }

// stop releases the handlers and returns the most connections held.
func (s *boundsServer) stop() int32 {
	close(s.done)
	s.sample.Wait()
	close(s.gate)
	return s.peak.Load()
}
