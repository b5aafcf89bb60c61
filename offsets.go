package pgdedup

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgdedup/pgdedup/internal/engine"
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

// offsetStatements are a Store's SQL for offsets, built once in New.
//
// The claim is one upsert. On conflict it updates only if the new offset is
// higher and the generation not older. It keeps the value it replaces in
// prev_offset, so RETURNING prev_offset tells which offsets of a batch are
// new. All of them are new when the row was just inserted, with prev_offset
// NULL. The upsert locks the partition's row, so concurrent claims of one
// partition take turns. In read committed, the one that waited re-checks
// against the row the other committed. Nothing updated means a duplicate or a
// fenced claim. The stored row, read next in the same round trip and still
// locked by the upsert, says which. updated_at takes the inserted row's
// default, now(), rather than calling now() in the SET clause. Citus refuses
// that on a distributed table, where only immutable functions may run.
type offsetStatements struct {
	table  string
	claim  string // $1 consumer, $2 topic, $3 partition, $4 highest offset, $5 generation
	stored string // $1 consumer, $2 topic, $3 partition
	resume string // $1 consumer, $2 topics, $3 partitions
}

func newOffsetStatements(table pgx.Identifier) offsetStatements {
	t := table.Sanitize()
	return offsetStatements{
		table: t,
		claim: `INSERT INTO ` + t + ` AS o (consumer, topic, partition, last_offset, generation)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (consumer, topic, partition) DO UPDATE
SET prev_offset = o.last_offset, last_offset = EXCLUDED.last_offset, generation = EXCLUDED.generation, updated_at = EXCLUDED.updated_at
WHERE o.last_offset < EXCLUDED.last_offset AND o.generation <= EXCLUDED.generation
RETURNING prev_offset`,
		stored: `SELECT last_offset, generation FROM ` + t + ` WHERE consumer = $1 AND topic = $2 AND partition = $3`,
		resume: `SELECT topic, partition, last_offset + 1 FROM ` + t + `
WHERE consumer = $1 AND (topic, partition) IN (SELECT * FROM unnest($2::text[], $3::int[]))`,
	}
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
	out := make(map[string]map[int32]int64)
	if len(topics) == 0 {
		return out, nil
	}
	rows, err := s.db.Query(ctx, s.offsets.resume, s.cfg.Consumer, topics, parts)
	if err != nil {
		return nil, engine.FromDatabase(fmt.Errorf("pgdedup: read offsets: %w", withDetail(err)))
	}
	var topic string
	var n int32
	var next int64
	_, err = pgx.ForEachRow(rows, []any{&topic, &n, &next}, func() error {
		if out[topic] == nil {
			out[topic] = make(map[int32]int64)
		}
		out[topic][n] = next
		return nil
	})
	if err != nil {
		return nil, engine.FromDatabase(fmt.Errorf("pgdedup: read offsets: %w", withDetail(err)))
	}
	return out, nil
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
