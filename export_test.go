package pgdedup

import "time"

// SetPartitionWaits sets how long s's Cleanup waits for old transactions
// before sealing partitions, and for one DETACH CONCURRENTLY, on the
// partitioned layout.
func SetPartitionWaits(s *Store, seal, detach time.Duration) {
	s.waits.seal, s.waits.detach = seal, detach
}

// SetAfterDetach makes s's Cleanup call f with a partition's name once it
// has detached it, before it drops it: tests interrupt the run there.
func SetAfterDetach(s *Store, f func(partition string)) {
	s.waits.detached = f
}
