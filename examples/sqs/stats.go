package main

import (
	"log/slog"
	"sync"
)

// stats counts what a consumer did with the messages it received, for the log
// line it writes when it stops. Per-message detail is in the debug log.
type stats struct {
	mu          sync.Mutex
	outcomes    map[outcome]int
	redelivered int // messages SQS had handed out before (ApproximateReceiveCount > 1)
}

func (s *stats) add(m *message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.outcomes == nil {
		s.outcomes = map[outcome]int{}
	}
	s.outcomes[m.Outcome]++
	if m.ReceiveCount > 1 {
		s.redelivered++
	}
}

func (s *stats) log(log *slog.Logger, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	log.Info(msg,
		"processed", s.outcomes[processed],
		"duplicates", s.outcomes[duplicate],
		"in_flight", s.outcomes[inFlight],
		"failed", s.outcomes[failed],
		"stopped", s.outcomes[stopped],
		"rejected", s.outcomes[rejected],
		"redelivered", s.redelivered)
}
