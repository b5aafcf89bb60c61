package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// consumerConfig is what one consumer process needs; main fills it from flags
// and environment variables.
type consumerConfig struct {
	DatabaseURL     string
	Endpoint        string // SQS endpoint URL; empty for AWS's, from the region
	QueueURL        string
	KeyAttribute    string        // message attribute holding the producer's idempotency key
	Name            string        // this process, recorded in charges.charged_by
	Pollers         int           // concurrent long polls, each handling its batch
	BatchSize       int           // MaxNumberOfMessages, 1 to 10
	Wait            time.Duration // long-poll WaitTimeSeconds, at most 20s
	LockTimeout     time.Duration // pgdedup.Config.LockTimeout: give up on a key in flight elsewhere
	Retention       time.Duration // pgdedup.Config.Retention: longer than SQS can hand a message back
	RequeueDelay    time.Duration // visibility given to a message whose key was in flight or that failed
	HandlerDelay    time.Duration // simulated work inside the transaction, e.g. a call to a payment API
	ShutdownTimeout time.Duration // how long SIGTERM waits for batches being processed
	Log             *slog.Logger
}

// consumer charges orders from an SQS queue, each order once.
type consumer struct {
	cfg     consumerConfig
	client  *sqs.Client
	charger *charger
	stats   stats
}

// consume runs a consumer until ctx is cancelled (SIGTERM). On cancel it stops
// polling, finishes and deletes the batches it holds, and returns. A message
// it never deletes (a crash, a failed charge) becomes visible again when its
// visibility timeout ends, and pgdedup skips it if its charge had committed.
func consume(ctx context.Context, cfg consumerConfig) error {
	pool, store, err := openStore(ctx, cfg.DatabaseURL, cfg.Name, cfg.Pollers+1, cfg.LockTimeout, cfg.Retention, cfg.Log)
	if err != nil {
		return err
	}
	defer pool.Close()
	client, err := newClient(ctx, cfg.Endpoint)
	if err != nil {
		return err
	}
	c := &consumer{cfg: cfg, client: client,
		charger: &charger{store: store, name: cfg.Name, handlerDelay: cfg.HandlerDelay, log: cfg.Log}}
	cfg.Log.Info("consuming", "queue", cfg.QueueURL, "pollers", cfg.Pollers, "batch", cfg.BatchSize)

	// A batch half done at SIGTERM is finished and deleted rather than left
	// to come back after its visibility timeout.
	workCtx := context.WithoutCancel(ctx)
	// A poller that gives up (SQS unreachable) stops the others: the process
	// exits 1 and its supervisor restarts it.
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	errs := make(chan error, cfg.Pollers)
	var wg sync.WaitGroup
	for range cfg.Pollers {
		wg.Go(func() {
			if err := c.poll(pollCtx, workCtx); err != nil {
				errs <- err
				stopPolling()
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		cfg.Log.Info("shutting down: no new receives, finishing the batches held")
		select {
		case <-done:
		case <-time.After(cfg.ShutdownTimeout):
			return fmt.Errorf("shutdown: batches still in flight after %s; SQS redelivers them", cfg.ShutdownTimeout)
		}
	}
	c.stats.log(cfg.Log, "stopped")
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// poll long-polls the queue and handles what it receives until ctx ends.
func (c *consumer) poll(ctx, workCtx context.Context) error {
	failures := 0
	for ctx.Err() == nil {
		out, err := c.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    &c.cfg.QueueURL,
			MaxNumberOfMessages:         int32(c.cfg.BatchSize),
			WaitTimeSeconds:             int32(c.cfg.Wait / time.Second),
			MessageAttributeNames:       []string{c.cfg.KeyAttribute},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount, types.MessageSystemAttributeNameSentTimestamp},
		})
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			// SQS unreachable: back off, and give up after a minute of it
			// (a supervisor restarts the process).
			if failures++; failures > 30 {
				return fmt.Errorf("receive: %w", err)
			}
			c.cfg.Log.Warn("receive", "error", err)
			_ = sleep(ctx, 2*time.Second)
			continue
		}
		failures = 0
		if len(out.Messages) > 0 {
			c.handle(workCtx, out.Messages)
		}
	}
	return nil
}

// handle charges one received batch and settles each message with SQS:
// delete it once its charge is committed (or it was a duplicate), make it
// visible again soon when its key is in flight elsewhere or its charge
// failed, and leave a message that can never be charged to the redrive policy.
func (c *consumer) handle(ctx context.Context, received []types.Message) {
	msgs := make([]*message, len(received))
	for i, r := range received {
		key := ""
		if a, ok := r.MessageAttributes[c.cfg.KeyAttribute]; ok && a.StringValue != nil {
			key = *a.StringValue
		}
		count, _ := strconv.Atoi(r.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
		msgs[i] = newMessage(aws.ToString(r.MessageId), key, aws.ToString(r.Body), count, r.Attributes[string(types.MessageSystemAttributeNameSentTimestamp)])
	}
	c.charger.chargeBatch(ctx, msgs)

	// DeleteMessage only after COMMIT: a crash between the two leaves the
	// message to come back, and pgdedup reports it as a duplicate then.
	var del []types.DeleteMessageBatchRequestEntry
	for i, m := range msgs {
		switch {
		case m.Outcome.done():
			del = append(del, types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: received[i].ReceiptHandle})
		case m.Outcome == inFlight || m.Outcome == failed:
			// Retry soon rather than after the whole visibility timeout:
			// skipped then if the other transaction committed, charged if
			// it rolled back.
			_, err := c.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
				QueueUrl: &c.cfg.QueueURL, ReceiptHandle: received[i].ReceiptHandle,
				VisibilityTimeout: int32(c.cfg.RequeueDelay / time.Second),
			})
			if err != nil {
				c.cfg.Log.Warn("change visibility", "sqs_message_id", m.SQSID, "error", err)
			}
		}
		// rejected: left alone. After maxReceiveCount receives the queue's
		// redrive policy moves it to the dead-letter queue.
	}
	if len(del) > 0 {
		out, err := c.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &c.cfg.QueueURL, Entries: del})
		switch {
		case err != nil:
			c.cfg.Log.Warn("delete messages", "messages", len(del), "error", err)
		case len(out.Failed) > 0:
			// A receipt handle that expired (the visibility timeout ran out
			// first): the message comes back, and is a duplicate then.
			c.cfg.Log.Warn("delete messages", "failed", len(out.Failed), "first", aws.ToString(out.Failed[0].Message))
		}
	}
	anyFailed := false
	for _, m := range msgs {
		logOutcome(c.cfg.Log, m)
		c.stats.add(m)
		anyFailed = anyFailed || m.Outcome == failed
	}
	if anyFailed {
		_ = sleep(ctx, time.Second) // don't spin on a database that is down
	}
}

// errNoQueue is returned by the commands when neither -queue-url nor -queue
// names a queue.
var errNoQueue = errors.New("-queue-url or -queue must name a queue")
