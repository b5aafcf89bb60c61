package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/pgdedup/pgdedup/examples/internal/fleet"
)

// TestKilledLambdaRuntimesChargeEachOrderOnce runs the Lambda function the
// way Lambda does: two execution environments, each the test binary running
// lambda.Start against a local runtime API, fed by an event source mapping
// that receives from a real SQS-compatible queue, sends the event JSON, and
// deletes what BatchItemFailures does not name. It SIGKILLs environments in
// the middle of invocations (the whole batch comes back after the
// visibility timeout) and checks that every order was charged exactly once,
// that only the unparseable messages reached the dead-letter queue, and
// that partial batch failures happened.
func TestKilledLambdaRuntimesChargeEachOrderOnce(t *testing.T) {
	const (
		orders       = 200
		environments = 2
		kills        = 3
		visibility   = 5 // seconds
		maxReceives  = 6
	)
	endpoint := sqsEndpoint(t)
	db := fleet.ShopDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rng := fleet.Rand(t)

	client := testClient(t, endpoint)
	url, dlq := testQueue(t, client, rng, visibility, maxReceives)
	attrs, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &url, AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	batch := orderBatch{RunID: "l", Orders: orders, Duplicates: 0.15, WithoutKey: 0.05, KeyAttribute: defaultKeyAttribute}
	poison := []string{"not json", `{"order_id":"y","amount_cents":0}`}
	want, sent, dups := sendOrders(t, ctx, client, url, rng, batch, poison)

	start := time.Now()
	env := []string{"DATABASE_URL=" + db.URL, "LOCK_TIMEOUT=500ms", "HANDLER_DELAY=150ms"}
	esm := &eventSource{client: client, url: url, arn: attrs.Attributes[string(types.QueueAttributeNameQueueArn)]}
	esmCtx, stopESM := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, environments)
	rts := make([]*runtimeAPI, environments)
	var procs []*lambdaProc
	live := make([]*lambdaProc, environments)
	for i := range rts {
		rts[i] = newRuntimeAPI(t)
		live[i] = startLambda(t, rts[i], fmt.Sprintf("fn%02d", len(procs)+1), env...)
		procs = append(procs, live[i])
		wg.Go(func() {
			if err := esm.poll(esmCtx, rts[i]); err != nil {
				errs <- err
			}
		})
	}
	stop := func() { stopESM(); wg.Wait() }
	defer stop()

	killAt := fleet.KillPoints(rng, kills, orders)
	killed := 0
	for tick := time.NewTicker(100 * time.Millisecond); ; <-tick.C {
		select {
		case err := <-errs:
			t.Fatalf("event source mapping: %v", err)
		default:
		}
		if ctx.Err() != nil {
			t.Fatalf("queue not drained after %s: %d orders charged of %d", time.Since(start), fleet.CountCharged(t, db), orders)
		}
		charged := fleet.CountCharged(t, db)
		if killed < kills && charged >= killAt[killed] {
			// Kill an environment in the first 50ms of an invocation: each
			// runs at least the 150ms HANDLER_DELAY, so the kill comes
			// before its answer, inside or before the transaction.
			i := rng.IntN(environments)
			select {
			case <-rts[i].handedOut():
			case <-time.After(10 * time.Second): // idle: kill it all the same
			}
			time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond)
			live[i].kill()
			rts[i].abandon()
			t.Logf("SIGKILL %s at %d/%d orders charged (%d messages logged)", live[i].name, charged, orders, live[i].log.Counts().Deliveries)
			killed++
			live[i] = startLambda(t, rts[i], fmt.Sprintf("fn%02d", len(procs)+1), env...)
			procs = append(procs, live[i])
			continue
		}
		if charged < orders {
			continue
		}
		if drained(t, ctx, client, url, dlq, len(poison)) {
			break
		}
	}
	stop()
	elapsed := time.Since(start)

	fleet.CheckCharges(t, db, want)
	checkDeadLetters(t, client, dlq, poison)
	var total fleet.Counts
	for _, p := range procs {
		total.Add(p.log.Counts())
	}
	n := esm.counts
	rolledBack := fleet.CountRolledBack(t, db)
	t.Logf("%d messages (%d orders, %d sent twice, %d unparseable) in %s; %d function processes, %d SIGKILLed mid-invocation",
		sent, orders, dups, len(poison), elapsed.Round(time.Millisecond), len(procs), killed)
	t.Logf("invocations %d (failed by kills %d, with partial batch failures %d: %d items), messages deleted %d; messages logged %d, redelivered %d (charged %d, skipped as already charged %d), in flight %d, rejected %d; charges rolled back by kills %d",
		n.Invocations, n.FailedInvocations, n.PartialBatches, n.ItemFailures, n.Deleted,
		total.Deliveries, total.Redelivered, total.RedeliveredProcessed, total.RedeliveredDuplicates, total.InFlight, total.Rejected, rolledBack)
	switch {
	case total.Races > 0:
		t.Errorf("the race detector reported %d data races in function processes", total.Races)
	case total.Failed > 0:
		t.Errorf("%d messages failed", total.Failed)
	case n.FailedInvocations == 0:
		t.Errorf("no invocation failed: the kills tested nothing")
	case n.PartialBatches == 0:
		t.Errorf("no partial batch failure: the unparseable messages never came back as BatchItemFailures")
	case total.RedeliveredProcessed+total.RedeliveredDuplicates == 0:
		t.Errorf("no valid message was redelivered after a kill")
	}
}
