package demo

import "testing"

// The broker hands out every order, redelivers every crashed delivery, and
// stops once everything is acked, even at the highest crash rate.
func TestBrokerDeliversEveryOrderAtLeastOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		redeliver, crash float64
	}{{0, 0}, {0.3, 0.05}, {1, MaxCrashRate}} {
		const orders = 2000
		b := newBroker(orders, tc.redeliver, tc.crash, 8, 42)
		acked := make(map[int]int)
		for {
			d, ok := b.next()
			if !ok {
				break
			}
			if d.crash != noCrash {
				b.nack(d)
				continue
			}
			acked[d.order]++
			b.ack()
		}
		s := b.snapshot()
		if len(acked) != orders {
			t.Errorf("rates %v: %d orders acked, want %d", tc, len(acked), orders)
		}
		if want := orders + s.ConcurrentDups + s.LaterDups + s.CrashRedelivers; s.Deliveries != want {
			t.Errorf("rates %v: %d deliveries, want orders+duplicates+redeliveries = %d", tc, s.Deliveries, want)
		}
		if dups := s.ConcurrentDups + s.LaterDups; tc.redeliver == 0 && dups != 0 || tc.redeliver == 1 && dups != orders {
			t.Errorf("rates %v: %d duplicated orders", tc, dups)
		}
		if tc.crash == 0 && s.CrashRedelivers != 0 || tc.crash > 0 && s.CrashRedelivers == 0 {
			t.Errorf("rates %v: %d crash redeliveries", tc, s.CrashRedelivers)
		}
		if done, total := b.progress(); done != total {
			t.Errorf("rates %v: progress %d/%d at the end", tc, done, total)
		}
	}
}
