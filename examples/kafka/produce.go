package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"
)

// orderBatch describes the records a producer sends in one run.
type orderBatch struct {
	RunID      string  // makes order IDs unique across runs
	Orders     int     // distinct orders
	Duplicates float64 // share of orders produced a second time, as an application retrying a send does
	Poison     int     // unparseable records mixed in
}

// records returns the batch's records, keyed by order ID (so that both copies
// of an order land in the same partition), the orders by ID, and how many
// records are second copies. Half of the second copies follow their original
// at once; the others come later, anywhere in the batch.
func (b orderBatch) records(rng *rand.Rand, topic string) (recs []*kgo.Record, orders map[string]Order, duplicates int) {
	type keyed struct {
		at  float64
		rec *kgo.Record
	}
	var all []keyed
	orders = make(map[string]Order, b.Orders)
	for i := range b.Orders {
		o := Order{
			OrderID:     fmt.Sprintf("ord-%s-%06d", b.RunID, i),
			Customer:    fmt.Sprintf("cust-%04d", rng.IntN(1000)),
			AmountCents: 100 + rng.Int64N(100_000),
		}
		orders[o.OrderID] = o
		value, _ := json.Marshal(o) // cannot fail: strings and an int
		all = append(all, keyed{float64(i), &kgo.Record{Topic: topic, Key: []byte(o.OrderID), Value: value}})
		if rng.Float64() < b.Duplicates {
			at := float64(i) + 0.5
			if rng.IntN(2) == 0 {
				at = float64(i) + rng.Float64()*float64(b.Orders-i)
			}
			all = append(all, keyed{at, &kgo.Record{Topic: topic, Key: []byte(o.OrderID), Value: value}})
			duplicates++
		}
	}
	for i := range b.Poison {
		all = append(all, keyed{rng.Float64() * float64(b.Orders), &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "poison-%d", i), Value: []byte("not json")}})
	}
	slices.SortStableFunc(all, func(x, y keyed) int { return cmp.Compare(x.at, y.at) })
	for _, k := range all {
		recs = append(recs, k.rec)
	}
	return recs, orders, duplicates
}

// produce sends recs and returns once the brokers have acknowledged every one
// (acks=all and idempotent writes are franz-go's defaults, so a retried send is
// not written twice).
func produce(ctx context.Context, cl *kgo.Client, recs []*kgo.Record) error {
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	return nil
}
