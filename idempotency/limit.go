package idempotency

import (
	"context"
	"sync"
	"time"
)

// acquire takes one of the MaxInFlight turns to hold a database connection,
// waiting at most AcquireTimeout. ok is false when none came free in time or
// the request's context ended.
func (m *Middleware) acquire(ctx context.Context) (release func(), ok bool) {
	select {
	case m.slots <- struct{}{}:
		return m.release, true
	default:
	}
	m.queued.Add(1)
	defer m.queued.Add(-1)
	t := time.NewTimer(m.cfg.AcquireTimeout)
	defer t.Stop()
	select {
	case m.slots <- struct{}{}:
		return m.release, true
	case <-t.C:
		return nil, false
	case <-ctx.Done():
		return nil, false
	}
}

func (m *Middleware) release() { <-m.slots }

// flights are the keyed requests in progress in this process, by scoped ID.
// A request whose key is in flight waits here, in memory, instead of in the
// database. Only the first request of a key holds a connection. When it ends
// with a kept answer, the waiters replay it without a round trip.
type flights struct {
	mu    sync.Mutex
	calls map[string]*flight
}

// flight is one request in progress. done is closed when it ends. kept is
// then its answer as stored, with its fingerprint. It is nil if nothing was
// kept, and then a waiter tries the key itself.
type flight struct {
	done    chan struct{}
	waiters int
	kept    *response
}

// join returns the flight of id and whether the caller leads it. A leader
// gets a new flight, which it must end with finish. A caller that does not
// lead may wait when it can be counted among at most maxWaiters. wait is
// false otherwise.
func (f *flights) join(id string, maxWaiters int) (fl *flight, lead, wait bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.calls[id]; fl != nil {
		if fl.waiters >= maxWaiters {
			return fl, false, false
		}
		fl.waiters++
		return fl, false, true
	}
	fl = &flight{done: make(chan struct{})}
	f.calls[id] = fl
	return fl, true, false
}

// waiting returns how many requests wait for a key in flight.
func (f *flights) waiting() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, fl := range f.calls {
		n += fl.waiters
	}
	return n
}

// leave undoes a waiter's join.
func (f *flights) leave(fl *flight) {
	f.mu.Lock()
	fl.waiters--
	f.mu.Unlock()
}

// finish ends the flight of id that the caller leads, with kept as its answer.
func (f *flights) finish(id string, fl *flight, kept *response) {
	f.mu.Lock()
	delete(f.calls, id)
	fl.kept = kept
	f.mu.Unlock()
	close(fl.done)
}
