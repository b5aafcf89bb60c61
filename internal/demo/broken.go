package demo

import (
	"context"
	"sync"
)

// keyStore stands in for Redis. It is one store shared by every consumer,
// whose single operations (EXISTS, SET, SET NX) are atomic but live outside
// the database transaction that charges.
type keyStore struct {
	mu   sync.Mutex
	keys map[string]struct{}
}

func newKeyStore() *keyStore { return &keyStore{keys: make(map[string]struct{})} }

func (s *keyStore) exists(k string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.keys[k]
	return ok
}

func (s *keyStore) set(k string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys[k] = struct{}{}
}

// setNX sets k and reports whether it was absent, like SET k 1 NX EX ttl.
func (s *keyStore) setNX(k string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.keys[k]; ok {
		return false
	}
	s.keys[k] = struct{}{}
	return true
}

// checkThenAct is the recipe from most tutorials. If EXISTS id, it skips,
// else it charges and then does SET id. Two consumers holding the same message
// both find it absent and both charge. A crash after charging and before SET
// leaves no mark, so the redelivery charges again.
type checkThenAct struct {
	keys *keyStore
	charger
}

func (checkThenAct) name() string  { return "check-then-act (EXISTS, charge, SET)" }
func (checkThenAct) table() string { return tableCheckThenAct }
func (checkThenAct) restart(int)   {}

func (r checkThenAct) handle(ctx context.Context, c int, d delivery) (outcome, error) {
	id := d.messageID()
	if r.keys.exists(id) {
		return skipped, nil
	}
	if o, err := r.chargeOrCrash(ctx, c, d); o != charged || err != nil {
		return o, err
	}
	r.keys.set(id)
	return charged, nil
}

// chargeOrCrash does the handler's work and commits the charge, stopping where
// d crashes. It is the middle of every broken recipe, where the charge
// commits on its own, apart from the dedup record.
func (ch charger) chargeOrCrash(ctx context.Context, c int, d delivery) (outcome, error) {
	if err := work(ctx, d); err != nil {
		return 0, err
	}
	if d.crash == crashBeforeCharge {
		return crashed, nil
	}
	if err := ch.charge(ctx, ch.pool, c, d); err != nil {
		return 0, err
	}
	if d.crash == crashAfterCharge {
		return crashed, nil
	}
	return charged, nil
}

// inProcessSet keeps the IDs each consumer has handled in its own memory. A
// duplicate delivered to another consumer is not in that consumer's set, and
// a restart empties the set.
type inProcessSet struct {
	seen []map[string]struct{} // per consumer, and consumer c handles one delivery at a time
	charger
}

func newInProcessSet(consumers int, ch charger) *inProcessSet {
	r := &inProcessSet{seen: make([]map[string]struct{}, consumers), charger: ch}
	for c := range r.seen {
		r.seen[c] = make(map[string]struct{})
	}
	return r
}

func (*inProcessSet) name() string  { return "in-process set per consumer" }
func (*inProcessSet) table() string { return tableInProcessSet }

func (r *inProcessSet) restart(c int) { r.seen[c] = make(map[string]struct{}) }

func (r *inProcessSet) handle(ctx context.Context, c int, d delivery) (outcome, error) {
	id := d.messageID()
	if _, ok := r.seen[c][id]; ok {
		return skipped, nil
	}
	if o, err := r.chargeOrCrash(ctx, c, d); o != charged || err != nil {
		return o, err
	}
	r.seen[c][id] = struct{}{}
	return charged, nil
}

// markThenProcess is the Redis SET NX order. It does SET id NX first and
// charges only if the key was absent. Races are gone (SET NX is atomic), but a
// crash after the SET and before the charge commits leaves the ID marked and
// the order never charged, so every redelivery is skipped.
type markThenProcess struct {
	keys *keyStore
	charger
}

func (markThenProcess) name() string  { return "mark-then-process (SET NX, charge)" }
func (markThenProcess) table() string { return tableMarkThenProcess }
func (markThenProcess) restart(int)   {}

func (r markThenProcess) handle(ctx context.Context, c int, d delivery) (outcome, error) {
	if !r.keys.setNX(d.messageID()) {
		return skipped, nil
	}
	return r.chargeOrCrash(ctx, c, d)
}
