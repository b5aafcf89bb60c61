// Package citus tests pgdedup on a real Citus cluster: exactly-once under
// concurrent consumers, an ambiguous COMMIT, a worker crashing under load,
// concurrent cleaners, Config.LockTimeout on the workers, the distribute
// command, and a worker added and shards rebalanced while consumers run.
//
// The cluster is named by TEST_CITUS_URL (the coordinator; .ci/citus.sh starts
// one and sets it). Without it the tests skip, unless CI is set: then they
// fail. The crash test also needs TEST_CITUS_WORKER_PGDATA (a worker's data
// directory, restarted with pg_ctl) and the scale-out test
// TEST_CITUS_SPARE_WORKER (host:port of a running node with the citus
// extension, not yet in the cluster). These tests restart and add nodes: run
// this package on its own, not alongside other tests on the same cluster.
package citus
