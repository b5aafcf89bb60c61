package idempotency

// BodyCodec transforms response bodies on their way into the table and back
// ([Config.StoredBody]). What stays at rest for Retention, and in WAL and
// backups after it, is then only what must. A codec may do one of these.
//
//   - Omit. Seal returns nil, and a replay has the status and headers, an
//     empty body and [BodyOmittedHeader]. The client fetches the resource.
//   - Redact. Seal drops fields (a card number, a client secret), and Open
//     returns what Seal stored.
//   - Encrypt. Seal encrypts with a key kept outside the database, and Open
//     decrypts. Seal binds rowKey as additional data, so that a stored body
//     cannot be moved to another key's row.
//
// Methods must be safe for concurrent use.
type BodyCodec interface {
	// Seal returns what is stored for body, the answer with status to the
	// request whose key's row is rowKey (pgdedup.Key of the consumer and the
	// scoped key). nil stores no body. An error fails the request. Its writes
	// roll back and it gets 500.
	Seal(rowKey string, status int, body []byte) ([]byte, error)

	// Open returns the body to replay from what Seal stored. An error fails
	// the replay with 500. The handler is not run again.
	Open(rowKey string, status int, stored []byte) ([]byte, error)
}
