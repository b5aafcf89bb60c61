package main

import (
	"context"
	"strconv"

	"github.com/aws/aws-lambda-go/events"
)

// lambdaHandler is the Lambda function for an SQS event source mapping with
// ReportBatchItemFailures turned on. The Store (and its pool) is made once per
// execution environment, before lambda.Start, not per invocation.
type lambdaHandler struct {
	charger      *charger
	keyAttribute string // message attribute holding the producer's idempotency key
}

// Handle charges the orders of one SQS event and returns the messages to
// retry. SQS deletes every other message of the batch: the ones charged now
// and the duplicates (a redelivered batch, a producer's retry), which are
// done too. A message whose key is in flight elsewhere, whose charge failed,
// or that can never be charged comes back after its visibility timeout (the
// last one until the redrive policy moves it to the dead-letter queue).
//
// It never returns an error: that would make SQS retry the whole batch,
// the messages charged now included (pgdedup would skip them, at the cost of
// a second invocation).
func (h *lambdaHandler) Handle(ctx context.Context, event events.SQSEvent) (events.SQSEventResponse, error) {
	msgs := make([]*message, len(event.Records))
	for i, r := range event.Records {
		key := ""
		if a, ok := r.MessageAttributes[h.keyAttribute]; ok && a.StringValue != nil {
			key = *a.StringValue
		}
		count, _ := strconv.Atoi(r.Attributes["ApproximateReceiveCount"])
		msgs[i] = newMessage(r.MessageId, key, r.Body, count, r.Attributes["SentTimestamp"])
	}
	h.charger.chargeBatch(ctx, msgs)
	var resp events.SQSEventResponse
	for _, m := range msgs {
		logOutcome(h.charger.log, m)
		if !m.Outcome.done() {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: m.SQSID})
		}
	}
	return resp, nil
}
