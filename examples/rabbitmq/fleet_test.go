package main

import (
	"os"
	"testing"
)

// childEnv makes the test binary run as the consumer command instead of the
// tests, so the kill test starts real consumer processes without a separate
// build (and they run with the race detector too).
const childEnv = "PGDEDUP_RABBITMQ_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(runWithSignals(os.Args[1:]))
	}
	os.Exit(m.Run())
}
