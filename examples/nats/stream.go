package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ensureStream creates the orders stream, or updates it to this config:
// file storage (messages survive a server restart) and JetStream's publish-side
// duplicate window, which drops a second publish with the same Nats-Msg-Id
// within dupWindow. Producer and consumer both call it, so either may start
// first.
func ensureStream(ctx context.Context, js jetstream.JetStream, stream, subject string, dupWindow time.Duration) (jetstream.Stream, error) {
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       stream,
		Subjects:   []string{subject},
		Storage:    jetstream.FileStorage,
		Duplicates: dupWindow,
	})
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", stream, err)
	}
	return s, nil
}

// ensureConsumer creates the durable pull consumer every consumer process
// shares. Explicit acks: a message not acked within ackWait (the process
// died, or is still busy) is delivered again, to any of them, without limit.
// maxAckPending bounds the messages out unacked at once across all processes.
func ensureConsumer(ctx context.Context, s jetstream.Stream, durable string, ackWait time.Duration, maxAckPending int) (jetstream.Consumer, error) {
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxDeliver:    -1,
		MaxAckPending: maxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer %s: %w", durable, err)
	}
	return c, nil
}

// messageID is the ID pgdedup records for msg: the producer's Nats-Msg-Id
// header, which names the intent, so a republished order is recognised; or
// else the message's stream sequence, which is the same on every redelivery
// of that stored message (but differs for a second publish of the same order,
// and starts again if the stream is deleted and created anew).
func messageID(msg jetstream.Msg, meta *jetstream.MsgMetadata) string {
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		return id
	}
	return meta.Stream + "/" + strconv.FormatUint(meta.Sequence.Stream, 10)
}

// eventTimeHeader carries a message's event time, set once by its producer:
// CloudEvents' time attribute in the NATS binding's binary mode.
const eventTimeHeader = "ce-time"

// sentAt is the time pgdedup.WithSentAt gets for msg: the producer's event
// time (the ce-time header, RFC 3339), which every publish of one order
// carries unchanged; or else the time JetStream stored the message, which its
// redeliveries keep but a second publish of the same ID (past the stream's
// duplicate window) does not: Config.SentAtMargin, an hour by default, must
// cover how long a producer retries. On the partitioned table the claim then
// looks only in the partitions from that time less the margin on; a message
// older than the Retention gets pgdedup.ErrTooLate (and is terminated) rather
// than being processed after its ID may have been forgotten.
func sentAt(msg jetstream.Msg, meta *jetstream.MsgMetadata) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, msg.Headers().Get(eventTimeHeader)); err == nil {
		return t
	}
	return meta.Timestamp
}
