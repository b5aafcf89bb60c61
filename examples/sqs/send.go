package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/pgdedup/pgdedup/examples/internal/shop"
)

// orderBatch describes the messages a producer sends in one run.
type orderBatch struct {
	RunID        string  // makes order IDs unique across runs
	Orders       int     // distinct orders
	Duplicates   float64 // share of keyed orders sent a second time, as a producer retrying a SendMessage whose reply was lost does
	WithoutKey   float64 // share of orders sent without the key attribute: the consumer keys them by SQS's MessageId
	KeyAttribute string
}

// outgoing is one SendMessage: a body and, unless empty, its key attribute.
type outgoing struct {
	Body string
	Key  string
}

// messages returns the batch's messages and how many are duplicates. A
// duplicate is the same order with the same key attribute, sent again: SQS
// gives it a MessageId of its own, so only the key tells it is the same
// order. Orders without a key are sent once: a resend of one would be charged
// twice, which is why producers should set a key. Half of the duplicates
// follow their original at once (two consumers may hold both copies at the
// same time); the others come later, anywhere in the batch.
func (b orderBatch) messages(rng *rand.Rand) (msgs []outgoing, duplicates int) {
	type placed struct {
		at  float64
		msg outgoing
	}
	var all []placed
	for i := range b.Orders {
		o := shop.Order{
			OrderID:     fmt.Sprintf("ord-%s-%06d", b.RunID, i),
			Customer:    fmt.Sprintf("cust-%04d", rng.IntN(1000)),
			AmountCents: 100 + rng.Int64N(100_000),
		}
		body, _ := json.Marshal(o) // cannot fail: strings and an int
		msg := outgoing{Body: string(body)}
		if rng.Float64() >= b.WithoutKey {
			msg.Key = "charge-" + o.OrderID
		}
		all = append(all, placed{float64(i), msg})
		if msg.Key != "" && rng.Float64() < b.Duplicates {
			at := float64(i) + 0.5
			if rng.IntN(2) == 0 {
				at = float64(i) + rng.Float64()*float64(b.Orders-i)
			}
			all = append(all, placed{at, msg})
			duplicates++
		}
	}
	slices.SortStableFunc(all, func(x, y placed) int { return cmp.Compare(x.at, y.at) })
	for _, p := range all {
		msgs = append(msgs, p.msg)
	}
	return msgs, duplicates
}

// send sends msgs to the queue, ten per SendMessageBatch call, and returns
// once SQS has stored every one.
func send(ctx context.Context, client *sqs.Client, url, keyAttribute string, msgs []outgoing) error {
	for start := 0; start < len(msgs); start += 10 {
		var entries []types.SendMessageBatchRequestEntry
		for i, m := range msgs[start:min(start+10, len(msgs))] {
			e := types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(m.Body)}
			if m.Key != "" {
				e.MessageAttributes = map[string]types.MessageAttributeValue{
					keyAttribute: {DataType: aws.String("String"), StringValue: aws.String(m.Key)},
				}
			}
			entries = append(entries, e)
		}
		out, err := client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &url, Entries: entries})
		if err != nil {
			return fmt.Errorf("send messages %d-%d: %w", start, start+len(entries)-1, err)
		}
		if len(out.Failed) > 0 {
			f := out.Failed[0]
			return fmt.Errorf("SQS refused %d messages, first %s: %s", len(out.Failed), aws.ToString(f.Id), aws.ToString(f.Message))
		}
	}
	return nil
}
