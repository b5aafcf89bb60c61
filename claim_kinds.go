package pgdedup

import (
	"bytes"
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// This file holds the kinds of claim that every call is built from. They are
// one message ID, a batch of IDs, and a topic partition's offsets. Each kind is
// built for one call. The engine (engine.go) sends its statements and then
// reads its outcome. The calls themselves live in processed.go (own
// transaction), tx.go (the caller's pgx transaction) and databasesql.go (the
// caller's database/sql transaction).

// idClaim claims one message ID.
type idClaim struct {
	store      *Store
	id         string
	opts       callOptions
	withResult bool // read the stored result back, for ProcessResult

	claimed bool
	found   bool   // the SELECT after the claim found the ID's row
	stored  []byte // the fingerprint read after the claim
	result  []byte // the result read after the claim (withResult)
}

func (c *idClaim) statements(l *layouts) claimStatements {
	c.claimed, c.found, c.stored, c.result = false, false, nil, nil
	return claimStatements{settings: l.messages.settings(false), claim: l.messages.claimOne(c)}
}

// scanStored is the row callback of the SELECT after a claim with a
// fingerprint or for a result.
func (c *idClaim) scanStored(scan func(dest ...any) error) error {
	c.found = true
	if c.withResult {
		return scan(&c.stored, &c.result)
	}
	return scan(&c.stored)
}

// outcome tells a mismatch from a duplicate. A duplicate whose recorded
// fingerprint differs from the given one is a mismatch. A row without a
// fingerprint has nothing to compare. A row past expires_at that is not
// deleted yet is compared as any other, because it is the ID's record until
// it is deleted.
func (c *idClaim) outcome() (fresh, skipped int, err error) {
	switch {
	case c.claimed:
		return 1, 0, nil
	case c.opts.fingerprint != nil && c.stored != nil && !bytes.Equal(c.stored, c.opts.fingerprint):
		return 0, 0, &PayloadMismatchError{MessageID: c.id, Stored: c.stored, Given: c.opts.fingerprint}
	}
	return 0, 1, nil
}

func (c *idClaim) subject() string   { return strconv.Quote(c.id) }
func (c *idClaim) messageID() string { return c.id }
func (c *idClaim) size() int         { return 1 }

// batchClaim claims a batch of message IDs.
type batchClaim struct {
	store  *Store
	ids    []string    // as the caller gave them
	sorted sortedBatch // valid, each once, in key order
	fresh  map[string]struct{}
}

func (c *batchClaim) statements(l *layouts) claimStatements {
	c.fresh = make(map[string]struct{}, len(c.sorted.ids))
	return claimStatements{settings: l.messages.settings(true), claim: l.messages.claimMany(c)}
}

// addFresh is the row callback of a batch claim's statements, which return
// the IDs they inserted.
func (c *batchClaim) addFresh(scan func(dest ...any) error) error {
	var id string
	if err := scan(&id); err != nil {
		return err
	}
	c.fresh[id] = struct{}{}
	return nil
}

func (c *batchClaim) outcome() (fresh, skipped int, err error) {
	return len(c.fresh), len(c.sorted.ids) - len(c.fresh), nil
}

func (c *batchClaim) subject() string {
	return fmt.Sprintf("batch of %d IDs", len(c.sorted.ids))
}

func (c *batchClaim) messageID() string { return "" }
func (c *batchClaim) size() int         { return len(c.sorted.ids) }

// freshIDs returns the new IDs in the order they first appear in the
// caller's batch, each once.
func (c *batchClaim) freshIDs() []string {
	if len(c.fresh) == 0 {
		return nil
	}
	seen := make(map[string]struct{}, len(c.fresh))
	out := make([]string, 0, len(c.fresh))
	for _, id := range c.ids {
		if _, ok := c.fresh[id]; ok {
			if _, dup := seen[id]; !dup {
				seen[id] = struct{}{}
				out = append(out, id)
			}
		}
	}
	return out
}

// newBatchClaim validates ids and prepares their claim.
func (s *Store) newBatchClaim(ids []string) (*batchClaim, error) {
	sorted, err := prepareBatch(s.cfg.Consumer, ids, s.cfg.MaxBatch)
	if err != nil {
		return nil, err
	}
	return &batchClaim{store: s, ids: ids, sorted: sorted}, nil
}

// offsetsClaim claims offsets of one partition. It sends the upsert of the
// partition's row and then reads the stored row, which the upsert still
// locks. When nothing was updated, that row tells a duplicate from a fenced
// claim.
type offsetsClaim struct {
	store   *Store
	p       TopicPartition
	offsets []int64 // validated, not empty

	claimed   bool   // the upsert wrote the row
	prev      *int64 // the offset it replaced, nil if the row was new
	last, gen int64  // the stored row after the upsert
}

func (c *offsetsClaim) statements(l *layouts) claimStatements {
	s, p := c.store, c.p
	*c = offsetsClaim{store: s, p: p, offsets: c.offsets}
	return claimStatements{settings: l.offsets.settings(false), claim: []statement{
		{sql: s.offsets.claim, args: []any{s.cfg.Consumer, p.Topic, p.Partition, c.offsets[len(c.offsets)-1], p.Generation},
			row: func(scan func(...any) error) error { c.claimed = true; return scan(&c.prev) }},
		{sql: s.offsets.stored, args: []any{s.cfg.Consumer, p.Topic, p.Partition},
			row: func(scan func(...any) error) error { return scan(&c.last, &c.gen) }},
	}}
}

func (c *offsetsClaim) outcome() (fresh, skipped int, err error) {
	if !c.claimed {
		if c.gen > c.p.Generation {
			return 0, 0, fmt.Errorf("%w: %s partition %d: claimed in generation %d, stored %d (offset %d)",
				ErrFenced, c.p.Topic, c.p.Partition, c.p.Generation, c.gen, c.last)
		}
		return 0, len(c.offsets), nil
	}
	n := len(c.freshOffsets())
	return n, len(c.offsets) - n, nil
}

// freshOffsets returns the offsets above the one stored before the claim.
func (c *offsetsClaim) freshOffsets() []int64 {
	if !c.claimed {
		return nil
	}
	i := 0
	if c.prev != nil {
		for i < len(c.offsets) && c.offsets[i] <= *c.prev {
			i++
		}
	}
	return c.offsets[i:]
}

func (c *offsetsClaim) subject() string {
	first, last := c.offsets[0], c.offsets[len(c.offsets)-1]
	if first == last {
		return fmt.Sprintf("%s partition %d offset %d", c.p.Topic, c.p.Partition, first)
	}
	return fmt.Sprintf("%s partition %d offsets %d-%d", c.p.Topic, c.p.Partition, first, last)
}

func (c *offsetsClaim) messageID() string { return "" }

func (c *offsetsClaim) size() int { return len(c.offsets) }

// newIDClaim validates messageID and the options that call, the name of the
// exported method, was given, and prepares their claim.
func (s *Store) newIDClaim(call, messageID string, opts []Option) (*idClaim, error) {
	if err := ValidateMessageID(messageID); err != nil {
		return nil, err
	}
	o, err := s.cfg.callOptions(call, opts)
	if err != nil {
		return nil, err
	}
	return &idClaim{store: s, id: messageID, opts: o, withResult: call == callProcessResult}, nil
}

// claimID is Claim and ClaimSQL. It validates messageID and opts, and then
// run claims the ID in the caller's transaction.
func (s *Store) claimID(call, messageID string, opts []Option, run func(claim) error) (claimed bool, err error) {
	c, err := s.newIDClaim(call, messageID, opts)
	if err != nil {
		return false, err
	}
	if err := run(c); err != nil {
		return false, err
	}
	return c.claimed, nil
}

// claimBatch is ClaimBatch and ClaimBatchSQL. It validates messageIDs, and
// then run claims them in the caller's transaction.
func (s *Store) claimBatch(messageIDs []string, run func(claim) error) (fresh []string, err error) {
	c, err := s.newBatchClaim(messageIDs)
	if err != nil || len(c.sorted.ids) == 0 {
		return nil, err
	}
	if err := run(c); err != nil {
		return nil, err
	}
	return c.freshIDs(), nil
}

// claimOffsets is ClaimOffsets and ClaimOffsetsSQL. It validates p and
// offsets, and then run claims them in the caller's transaction.
func (s *Store) claimOffsets(p TopicPartition, offsets []int64, run func(claim) error) (fresh []int64, err error) {
	if err := validateOffsets(p, offsets); err != nil || len(offsets) == 0 {
		return nil, err
	}
	c := &offsetsClaim{store: s, p: p, offsets: offsets}
	if err := run(c); err != nil {
		return nil, err
	}
	return c.freshOffsets(), nil
}

// storeResult writes res into the row c claimed in tx.
func (s *Store) storeResult(ctx context.Context, tx pgx.Tx, c *idClaim, res []byte) error {
	l, err := s.layouts(ctx, pgxQueryRow(tx))
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	claimStatements{claim: []statement{l.messages.storeResult(c, res)}}.queue(b)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fromDatabase(fmt.Errorf("pgdedup: store the result of %s: %w", c.subject(), withDetail(err)))
	}
	return nil
}
