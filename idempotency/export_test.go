package idempotency

// Waiting returns how many requests wait for a turn on the database
// (MaxInFlight) and how many wait in memory for a key in flight.
func (m *Middleware) Waiting() (forTurn, forKey int) {
	return int(m.queued.Load()), m.flights.waiting()
}
