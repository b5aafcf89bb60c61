package fleet

import (
	"fmt"
	"time"
)

// Stall tells a fleet that makes no progress from a slow one, so that a kill
// test fails when its consumers are stuck, never because the machine is busy.
// Give Stuck the fleet's state at each tick (orders charged, deliveries
// logged: anything that changes while consumers work); it reports true once
// that state has not changed for Limit.
type Stall struct {
	Limit time.Duration

	last  string
	since time.Time
}

// Stuck reports whether state has stayed the same for s.Limit.
func (s *Stall) Stuck(state ...any) bool {
	now, cur := time.Now(), fmt.Sprint(state...)
	if cur != s.last || s.since.IsZero() {
		s.last, s.since = cur, now
		return false
	}
	return now.Sub(s.since) >= s.Limit
}
