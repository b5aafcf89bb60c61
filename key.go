package pgdedup

import (
	"crypto/sha256"
	"encoding/hex"
)

// Key returns the primary key of the row that records messageID for
// consumer. It is the first 16 bytes of SHA-256 over consumer, a 0 byte and
// messageID, as a UUID in canonical text form ("3f1c…-…"). The SQL function
// pgdedup_key(consumer, message_id) that migration 00003 creates computes the
// same value. So rows written by raw SQL, triggers and operators' queries
// agree with those written by a [Store].
//
// Use it to find an ID's row by its primary key (WHERE key = $1), or to give
// business rows the same key, for example to co-locate them with the claim on
// a distributed database. A 128-bit key makes a collision, which would make a
// new message look like a duplicate, negligible (about 10⁻²¹ at 10⁹ rows).
func Key(consumer, messageID string) string {
	var b [36]byte
	k := key(consumer, messageID)
	hex.Encode(b[0:8], k[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], k[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], k[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], k[8:10])
	b[23] = '-'
	hex.Encode(b[24:], k[10:16])
	return string(b[:])
}

// key is Key as 16 bytes.
func key(consumer, messageID string) [16]byte {
	h := sha256.New()
	h.Write([]byte(consumer))
	h.Write([]byte{0})
	h.Write([]byte(messageID))
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return [16]byte(sum[:16])
}

// MessageIDFromContent returns the hex SHA-256 of payload, a message ID for
// sources that give none (content-based dedup). Two messages with the same
// bytes get the same ID, so only use it where an identical payload means an
// identical intent.
func MessageIDFromContent(payload []byte) string {
	sum := sha256.Sum256(payload)
	return hex.EncodeToString(sum[:])
}
