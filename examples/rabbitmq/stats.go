package main

import (
	"log/slog"
	"sync/atomic"
)

// stats counts what a consumer did with its deliveries, for the log line it
// writes when it stops. Per-delivery detail is in the debug log.
type stats struct {
	processed   atomic.Int64 // charged and acked
	duplicates  atomic.Int64 // already charged: skipped and acked
	inFlight    atomic.Int64 // claim held elsewhere past the lock timeout: requeued
	failed      atomic.Int64 // error: requeued
	rejected    atomic.Int64 // unprocessable: rejected
	redelivered atomic.Int64 // deliveries RabbitMQ flagged as redelivered, whatever their outcome
}

func (s *stats) add(outcome *atomic.Int64, redelivered bool) {
	outcome.Add(1)
	if redelivered {
		s.redelivered.Add(1)
	}
}

func (s *stats) log(log *slog.Logger, msg string) {
	log.Info(msg,
		"processed", s.processed.Load(),
		"duplicates", s.duplicates.Load(),
		"in_flight", s.inFlight.Load(),
		"failed", s.failed.Load(),
		"rejected", s.rejected.Load(),
		"redelivered", s.redelivered.Load())
}
