package demo

import (
	"context"
	"sync"
	"sync/atomic"
)

// tally counts, per recipe, what its handler reported. These are only
// descriptive columns of the report, because charges are counted from the
// tables.
type tally struct {
	deliveries, skipped, crashes atomic.Int64
}

// simulate runs consumers consumers against b until every delivery is acked.
// Each delivery goes through every recipe at the same moment, as if each
// recipe were a consumer group of its own in the same process. When the
// delivery crashes, the process dies for all of them and the broker redelivers.
func simulate(ctx context.Context, b *broker, consumers int, recipes []recipe, tallies []*tally) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		once     sync.Once
		firstErr error
	)
	fail := func(err error) {
		once.Do(func() {
			firstErr = err
			cancel()
			b.close()
		})
	}
	stop := context.AfterFunc(ctx, b.close)
	defer stop()

	var wg sync.WaitGroup
	for c := range consumers {
		wg.Go(func() {
			for {
				d, ok := b.next()
				if !ok {
					return
				}
				if err := deliver(ctx, c, d, recipes, tallies); err != nil {
					fail(err)
					return
				}
				if d.crash == noCrash {
					b.ack()
					continue
				}
				for _, r := range recipes {
					r.restart(c)
				}
				b.nack(d)
			}
		})
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return firstErr
}

// deliver hands d to every recipe concurrently and waits for all of them.
func deliver(ctx context.Context, c int, d delivery, recipes []recipe, tallies []*tally) error {
	var wg sync.WaitGroup
	errs := make([]error, len(recipes))
	for i, r := range recipes {
		wg.Go(func() {
			o, err := r.handle(ctx, c, d)
			if err != nil {
				errs[i] = err
				return
			}
			t := tallies[i]
			t.deliveries.Add(1)
			switch o {
			case skipped:
				t.skipped.Add(1)
			case crashed:
				t.crashes.Add(1)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
