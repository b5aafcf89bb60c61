package pgdedup

import (
	"time"

	"github.com/pgdedup/pgdedup/internal/engine"
	"github.com/pgdedup/pgdedup/internal/shape"
	"github.com/pgdedup/pgdedup/internal/shape/partitioned"
)

// SetPartitionWaits sets how long s's Cleanup waits for old transactions
// before sealing partitions, and for one DETACH CONCURRENTLY, on the
// partitioned layout.
func SetPartitionWaits(s *Store, seal, detach time.Duration) {
	s.waits.Seal, s.waits.Detach = seal, detach
}

// SetAfterDetach makes s's Cleanup call f with a partition's name once it
// has detached it, before it drops it: tests interrupt the run there.
func SetAfterDetach(s *Store, f func(partition string)) {
	s.waits.Detached = f
}

// SetMoveTimes sets how far ahead of a move of a populated table Setup puts
// the switch (at least one span), and how often s looks a plain table up
// again (negative: never, as a release before the move would).
func SetMoveTimes(s *Store, lead, recheck time.Duration) {
	s.move = partitioned.MoveTimes{Lead: lead, Recheck: recheck}
}

// SetNoCarry makes s's Cleanup keep partitions with live rows instead of
// carrying the rows forward.
func SetNoCarry(s *Store) { s.waits.NoCarry = true }

// shaped, idClaim and statement keep TestClaimWithoutOptionsIsUnchanged
// reading the engine's claims of one ID on a shape as it always did.
type shaped struct{ sh shape.Shape }

func newShaped(sh shape.Shape) shaped { return shaped{sh} }

type idClaim struct {
	store *Store
	id    string
	opts  callOptions
}

type statement struct {
	sql  string
	args []any
	row  shape.RowFunc
}

// claimOne returns the statements the engine sends to claim c's ID on l.
func (l shaped) claimOne(c *idClaim) []statement {
	ec := &engine.IDClaim{ID: c.store.id(c.id), Retention: c.opts.retention, Fingerprint: c.opts.fingerprint}
	var out []statement
	for _, st := range ec.Statements(&engine.Layouts{Messages: l.sh}).Claim {
		out = append(out, statement{sql: st.SQL, args: st.Args, row: st.Row})
	}
	return out
}

// SetClock sets the clock that bounds s's claims on a partitioned table. Set
// it before s's first claim.
func SetClock(s *Store, clock func() time.Time) { s.clock = clock }
