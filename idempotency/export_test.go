package idempotency

// Waiting returns how many requests wait for a turn on the database
// (MaxInFlight) and how many wait in memory for a key in flight.
func (m *Middleware) Waiting() (forTurn, forKey int) {
	return int(m.queued.Load()), m.flights.waiting()
}

// DecodeStored reads a stored response, the result column of a key's row:
// its status, headers, body (as stored) and whether the body was omitted.
func DecodeStored(result []byte) (status int, header map[string][]string, body []byte, omitted bool, err error) {
	resp, err := decodeStored(result)
	if err != nil {
		return 0, nil, nil, false, err
	}
	return resp.status, resp.header, resp.body, resp.omitted, nil
}

// StoredOverhead is what a stored response may hold besides its body.
const StoredOverhead = storedOverhead
