package partitioned

// How many partitions a claim can afford. A claim locks every partition
// attached to the table, and each of its two indexes, when the claim is
// planned. PostgreSQL 15 cannot prune partitions before locking them for a
// generic plan, and planning locks the indexes. That is 3 locks per
// attached partition, plus about 12 of its own, measured with pg_locks
// (TestPartitionedClaimLocks). Past 16 they come from the server's shared
// lock table. It holds max_locks_per_transaction × (max_connections +
// max_prepared_transactions) locks for every session at once, 6,400 with
// PostgreSQL's defaults. So Config.Partitions is bounded by MaxPartitions,
// and Validate refuses more before touching the database. A claim then
// holds at most ClaimLocks(AttachedPartitions(MaxPartitions)) locks, about
// 200. So 30 claims at once fit the default table.

// AttachedPartitions is how many partitions are attached in the steady
// state with partitions per Retention. Those are the partitions of the
// last Retention, the current one, those created ahead, and one that ended
// a Retention ago and that the next Cleanup drops. A Cleanup held up
// sealing keeps more, and so does a partition kept for its live rows
// (carry.go).
func AttachedPartitions(partitions int) int {
	return partitions + Ahead + 2
}

// ClaimLocks is about how many locks a claim holds with attached
// partitions attached. It is the first claim of a session, which plans.
func ClaimLocks(attached int) int {
	return 3*attached + 12
}
