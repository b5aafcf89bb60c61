package main

import (
	"log/slog"
	"sync/atomic"
)

// stats counts what a consumer did with its records, for the log line it
// writes when it stops. Per-batch detail is in the debug log.
type stats struct {
	records       atomic.Int64 // records in batches that committed or were skipped whole
	skipped       atomic.Int64 // records at or below the stored offset: processed before, handler not run
	charged       atomic.Int64 // orders charged
	producedTwice atomic.Int64 // records of an order charged before (the producer sent it twice)
	rejected      atomic.Int64 // unparseable records, committed without a charge
	fenced        atomic.Int64 // batches refused: a newer generation holds the partition
	inFlight      atomic.Int64 // batches given up on: another transaction held the partition past the lock timeout
	failed        atomic.Int64 // batches that failed otherwise; sought back and fetched again
}

func (s *stats) log(log *slog.Logger, msg string) {
	log.Info(msg,
		"records", s.records.Load(),
		"skipped", s.skipped.Load(),
		"charged", s.charged.Load(),
		"produced_twice", s.producedTwice.Load(),
		"rejected", s.rejected.Load(),
		"fenced", s.fenced.Load(),
		"in_flight", s.inFlight.Load(),
		"failed", s.failed.Load())
}
