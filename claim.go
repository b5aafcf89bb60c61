package pgdedup

import (
	"bytes"
	"fmt"
	"strconv"
)

// The kinds of claim of message IDs: one ID, a batch. (The offsets of a
// partition are the third kind: offsets.go.) Each is built for one call and
// read once its statements have run; see engine.go.

// idClaim claims one message ID.
type idClaim struct {
	store      *Store
	id         string
	opts       callOptions
	withResult bool // ProcessResult: read the stored result back

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

// outcome: a duplicate whose recorded fingerprint differs from the given one
// is a mismatch, not a duplicate. A row without a fingerprint has nothing to
// compare. A row past expires_at that is not deleted yet is compared as any
// other: it is the ID's record until it is deleted.
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
