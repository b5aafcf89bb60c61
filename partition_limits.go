package pgdedup

// How many partitions a claim can afford. A claim locks every partition
// attached to the table, and each of its two indexes when the claim is
// planned (PostgreSQL 15 cannot prune partitions before locking them for a
// generic plan, and planning locks the indexes): 3 locks per attached
// partition, plus about 12 of its own, measured with pg_locks
// (TestPartitionedClaimLocks). Past 16 they come from the server's shared
// lock table, which holds max_locks_per_transaction × (max_connections +
// max_prepared_transactions) locks, 6,400 with PostgreSQL's defaults, for
// every session at once. So Config.Partitions is bounded by MaxPartitions
// (Validate refuses more before touching the database), which keeps a
// claim under claimLocks(maxAttachedPartitions), about 200 locks: 30 claims
// at once fit the default table.

// maxAttachedPartitions is the most partitions attached in the steady
// state at MaxPartitions.
const maxAttachedPartitions = MaxPartitions + partitionsAhead + 2

// attachedPartitions is how many partitions are attached in the steady
// state with partitions per Retention: those of the last Retention, the
// current one, those created ahead, and one ended a Retention ago that the
// next Cleanup drops. A Cleanup held up sealing (or a partition kept for
// its live rows, partition_carry.go) keeps more.
func attachedPartitions(partitions int) int {
	return partitions + partitionsAhead + 2
}

// claimLocks is about how many locks a claim holds with attached partitions
// attached (the first claim of a session, which plans).
func claimLocks(attached int) int {
	return 3*attached + 12
}
