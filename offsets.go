package pgdedup

import (
	"context"
	"fmt"
)

// TopicPartition is one partition of a topic in a partitioned log such as
// Kafka, as a consumer holds it. pgdedup keeps one row per
// ([Config.Consumer], Topic, Partition) in [Config.OffsetTable]. The row holds
// the highest offset whose effects committed (see [Store.ProcessOffsets]).
type TopicPartition struct {
	// Topic is the topic's name. It must be non-empty, valid UTF-8 without
	// NUL, and at most [MaxMessageIDLen] bytes.
	Topic string

	// Partition is the partition's number, from 0.
	Partition int32

	// Generation is the holder's fencing token, from 0. It is the consumer
	// group generation in which the consumer was assigned the partition. In
	// franz-go that is the second result of GroupMetadata, read in
	// kgo.AdjustFetchOffsetsFn. The stored generation never goes down, and a
	// claim made with an older generation than the stored one fails with
	// [ErrFenced]. So a consumer that lost the partition stops as soon as its
	// successor has committed once. Use generations for all claims of a
	// consumer, or leave it 0 for all of them. Without a fence the offset
	// check alone still prevents doubles.
	Generation int64
}

// ResumeOffsets returns the offset to resume consuming from for each
// partition of assigned (topic to partition numbers) that has a stored
// offset. That is the last processed offset plus 1. Seek every assigned
// partition to it before processing any of its records. With franz-go,
// return it from kgo.AdjustFetchOffsetsFn, which runs on every assignment
// after Kafka's offsets are fetched and before any record is (examples/kafka
// does so). Partitions without a stored offset are left out. Nothing of them
// was processed, so start them where the consumer group's reset policy says.
// It is one statement.
func (s *Store) ResumeOffsets(ctx context.Context, assigned map[string][]int32) (map[string]map[int32]int64, error) {
	var topics []string
	var parts []int32
	for topic, ps := range assigned {
		for _, n := range ps {
			if err := validatePartition(TopicPartition{Topic: topic, Partition: n}); err != nil {
				return nil, err
			}
			topics, parts = append(topics, topic), append(parts, n)
		}
	}
	return s.eng.ResumeOffsets(ctx, topics, parts)
}

func validatePartition(p TopicPartition) error {
	switch {
	case len(p.Topic) > MaxMessageIDLen:
		return fmt.Errorf("%w: topic of %d bytes, longer than %d", ErrInvalidOffset, len(p.Topic), MaxMessageIDLen)
	case p.Partition < 0:
		return fmt.Errorf("%w: partition %d is negative", ErrInvalidOffset, p.Partition)
	case p.Generation < 0:
		return fmt.Errorf("%w: generation %d is negative", ErrInvalidOffset, p.Generation)
	}
	if err := validateText(p.Topic); err != nil {
		return fmt.Errorf("%w: topic %s", ErrInvalidOffset, err)
	}
	return nil
}

// validateOffsets checks p and that offsets are non-negative and strictly
// increasing, the order in which a consumer must hand them over.
func validateOffsets(p TopicPartition, offsets []int64) error {
	if err := validatePartition(p); err != nil {
		return err
	}
	for i, o := range offsets {
		switch {
		case o < 0:
			return fmt.Errorf("%w: offset %d of %d is negative (%d)", ErrInvalidOffset, i, len(offsets), o)
		case i > 0 && o <= offsets[i-1]:
			return fmt.Errorf("%w: offset %d of %d (%d) is not above the one before (%d): hand over a partition's offsets in increasing order",
				ErrInvalidOffset, i, len(offsets), o, offsets[i-1])
		}
	}
	return nil
}
