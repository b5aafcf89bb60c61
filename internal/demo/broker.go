package demo

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// crashPoint is where a delivery's handler dies, if it does.
type crashPoint int

const (
	noCrash crashPoint = iota
	// crashBeforeCharge means the consumer dies after its dedup step, before
	// charging.
	crashBeforeCharge
	// crashAfterCharge means the consumer dies after charging, before the
	// handler finishes (before it marks the ID, commits, or acks).
	crashAfterCharge
)

// delivery is one hand-over of a message to a consumer. The broker decides up
// front how long the handler works and whether and where it crashes, so every
// recipe sees exactly the same delivery.
type delivery struct {
	order   int
	attempt int // 1 for the first delivery of this message, counting all copies
	work    time.Duration
	crash   crashPoint
}

func (d delivery) messageID() string { return fmt.Sprintf("order-%d", d.order) }

// broker is an at-least-once broker in memory. It queues every order once,
// duplicates a share of them (some right behind the original, some later) and
// redelivers whatever a consumer does not ack. Deliveries held back for "later"
// are released once enough other deliveries have gone out, or as soon as a
// consumer would otherwise wait.
type broker struct {
	mu        sync.Mutex
	cond      *sync.Cond
	rng       *rand.Rand
	crashRate float64
	laterSpan int
	ready     []delivery
	delayed   []delayedDelivery
	inFlight  int
	acked     int
	attempts  map[int]int // deliveries of each order so far
	crashes   map[int]int // crashed deliveries of each order so far
	stats     BrokerStats
	closed    bool
}

type delayedDelivery struct {
	due int // released when stats.Deliveries reaches due
	d   delivery
}

func newBroker(orders int, redeliverRate, crashRate float64, consumers int, seed uint64) *broker {
	b := &broker{
		rng:       rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		crashRate: crashRate,
		laterSpan: max(4*consumers, orders/10),
		attempts:  make(map[int]int, orders),
		crashes:   make(map[int]int),
	}
	b.cond = sync.NewCond(&b.mu)
	for o := range orders {
		b.ready = append(b.ready, b.newDelivery(o))
		if b.rng.Float64() >= redeliverRate {
			continue
		}
		if b.rng.IntN(2) == 0 {
			b.ready = append(b.ready, b.newDelivery(o))
			b.stats.ConcurrentDups++
		} else {
			b.later(b.newDelivery(o), len(b.ready))
			b.stats.LaterDups++
		}
	}
	return b
}

// newDelivery draws the handler's work time (the payment call, 0.1-0.6 ms) and
// whether it crashes, half of the crashes before charging and half after.
// (next lets no message crash more than maxCrashes times, so every run ends.)
func (b *broker) newDelivery(order int) delivery {
	b.attempts[order]++
	d := delivery{order: order, attempt: b.attempts[order],
		work: 100*time.Microsecond + time.Duration(b.rng.IntN(500))*time.Microsecond}
	if b.rng.Float64() < b.crashRate {
		d.crash = crashBeforeCharge + crashPoint(b.rng.IntN(2))
	}
	return d
}

// maxCrashes is how many deliveries of one message may crash.
const maxCrashes = 3

// later queues d to go out after a random number of other deliveries.
func (b *broker) later(d delivery, now int) {
	due := now + 1 + b.rng.IntN(b.laterSpan)
	b.delayed = append(b.delayed, delayedDelivery{due: due, d: d})
}

// next blocks until a delivery is ready and returns it, or returns false when
// every delivery has been acked (or the broker was closed).
func (b *broker) next() (delivery, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		if b.closed {
			return delivery{}, false
		}
		b.release()
		if len(b.ready) > 0 {
			d := b.ready[0]
			b.ready = b.ready[1:]
			if b.crashes[d.order] >= maxCrashes {
				d.crash = noCrash
			}
			b.inFlight++
			b.stats.Deliveries++
			return d, true
		}
		if b.inFlight == 0 {
			return delivery{}, false
		}
		b.cond.Wait()
	}
}

// release moves due deliveries to the ready queue, and the earliest delayed one
// when nothing else is ready, so that no consumer idles while work is pending.
func (b *broker) release() {
	keep := b.delayed[:0]
	earliest := -1
	for _, dd := range b.delayed {
		if dd.due <= b.stats.Deliveries {
			b.ready = append(b.ready, dd.d)
			continue
		}
		keep = append(keep, dd)
		if earliest < 0 || dd.due < keep[earliest].due {
			earliest = len(keep) - 1
		}
	}
	b.delayed = keep
	if len(b.ready) == 0 && earliest >= 0 {
		b.ready = append(b.ready, b.delayed[earliest].d)
		b.delayed = append(b.delayed[:earliest], b.delayed[earliest+1:]...)
	}
}

// ack settles a delivery its consumer finished.
func (b *broker) ack() {
	b.mu.Lock()
	b.inFlight--
	b.acked++
	b.mu.Unlock()
	b.cond.Broadcast()
}

// nack puts d back to be delivered again later, as a broker does when the
// consumer holding it dies.
func (b *broker) nack(d delivery) {
	b.mu.Lock()
	b.inFlight--
	b.stats.CrashRedelivers++
	b.crashes[d.order]++
	b.later(b.newDelivery(d.order), b.stats.Deliveries)
	b.mu.Unlock()
	b.cond.Broadcast()
}

// close makes next return false, for shutting down early.
func (b *broker) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cond.Broadcast()
}

// progress returns the deliveries acked and those acked, queued or in flight.
func (b *broker) progress() (done, total int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.acked, b.acked + b.inFlight + len(b.ready) + len(b.delayed)
}

func (b *broker) snapshot() BrokerStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}
