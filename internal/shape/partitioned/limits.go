package partitioned

// How many partitions a claim can afford. A claim locks each partition it
// plans to look in, and each of its two indexes. Its statement names its
// bounds as constants (bounded.go), so the planner prunes the other
// partitions before it locks them, and partitions created ahead cost
// nothing. A claim with a time looks in one to three partitions. One without
// looks in every partition up to the one after the current one. That is 3
// locks per partition, plus about 12 of its own, measured with pg_locks
// (TestPartitionedClaimLocks, TestBoundedClaimLocksOnlyItsPartitions). Past
// 16 they come from the server's shared lock table. It holds
// max_locks_per_transaction × (max_connections +
// max_prepared_transactions) locks for every session at once, 6,400 with
// PostgreSQL's defaults. So Config.Partitions is bounded by MaxPartitions,
// and Validate refuses more before touching the database. A claim without a
// time then holds at most ClaimLocks(LockedPartitions(MaxPartitions))
// locks, about 200. So 30 such claims at once fit the default table.

// LockedPartitions is how many partitions a claim without a time locks in
// the steady state with partitions per Retention. Those are the partitions
// of the last Retention, one that ended a Retention ago and that the next
// Cleanup drops, the current one and the next. A Cleanup held up sealing
// keeps more, and so does a partition kept for its live rows (carry.go).
func LockedPartitions(partitions int) int {
	return partitions + 3
}

// ClaimLocks is about how many locks a claim holds when it looks in
// partitions partitions. It is the first claim of a session, which plans.
func ClaimLocks(partitions int) int {
	return 3*partitions + 12
}
