package pgdedup

import "time"

// SetPartitionWaits sets how long s's Cleanup waits for old transactions
// before sealing partitions, and for one DETACH CONCURRENTLY, on the
// partitioned layout.
func SetPartitionWaits(s *Store, seal, detach time.Duration) {
	s.waits = partitionWaits{seal: seal, detach: detach}
}
