// Package faults is pgdedup's fault-injection suite: tests that break things
// the way production breaks them and then count, per message, how many times its
// business effect landed. pgdedup must come out at exactly once for every
// message, none missing.
//
// The scenarios, each in its own _test.go file:
//
//   - consumer processes that SIGKILL themselves at random points of a
//     delivery, fed from a durable queue (Queue), through pgdedup and, for
//     comparison, through the Redis SET NX recipe (RESP);
//   - connections cut around COMMIT by a proxy (CommitCutter), so that the
//     client cannot know whether its commit landed;
//   - a throwaway PostgreSQL cluster (internal/pgserver) restarted under load;
//   - Cleanup running throughout all of them (CleanerLoad), deleting only
//     expired rows;
//   - pgdedup's scenarios on both table layouts, the partitioned one
//     switching partitions every second.
//
// The helpers here are small on purpose: a queue table, a proxy, a cluster
// wrapper and a RESP client, each in a few dozen lines, so that what the suite
// proves does not hide behind a framework. The tests log their counts on
// FIGURES lines; docs/reliability.md says what each scenario guarantees.
package faults
