package idempotency

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
)

// A stored response is the result pgdedup.Store.ProcessResult keeps with the
// key. This file encodes its status, the headers kept for replay and its
// body. The first byte is the format's version, so that a later version
// can change the format and still read rows written before it.
//
// Version 1 is the only one.
//
//	version  1 byte, 1
//	flags    1 byte: bit 0, the body was not stored (BodyOmittedHeader)
//	status   2 bytes, big-endian
//	headers  uvarint count, then per header: uvarint length and name,
//	         uvarint count of values, each a uvarint length and the value
//	body     the rest: as sent, or as Config.StoredBody sealed it

const (
	storedVersion   = 1
	flagBodyOmitted = 1 << 0
)

// storedOverhead is what a stored response may hold besides a body of
// Config.MaxStoredBody bytes. That is its status, the headers kept for replay
// and what Config.StoredBody adds to the body (a nonce and a tag, say). A larger
// response fails its request with 500 and pgdedup.ErrResultTooLarge.
const storedOverhead = 64 << 10

// encodeStored returns resp, as forStorage left it, in the stored format.
func encodeStored(resp *response) []byte {
	n := 4 + binary.MaxVarintLen64 + len(resp.body)
	for k, vs := range resp.header {
		n += 2*binary.MaxVarintLen64 + len(k)
		for _, v := range vs {
			n += binary.MaxVarintLen64 + len(v)
		}
	}
	b := make([]byte, 0, n)
	var flags byte
	if resp.omitted {
		flags |= flagBodyOmitted
	}
	b = append(b, storedVersion, flags)
	b = binary.BigEndian.AppendUint16(b, uint16(resp.status))
	b = binary.AppendUvarint(b, uint64(len(resp.header)))
	for k, vs := range resp.header {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	if !resp.omitted {
		b = append(b, resp.body...)
	}
	return b
}

// errStoredFormat is a stored response this version cannot read.
var errStoredFormat = errors.New("idempotency: stored response")

// decodeStored reads a stored response. The body is as stored, sealed if
// Config.StoredBody sealed it. An omitted body is empty, not nil.
func decodeStored(b []byte) (*response, error) {
	bad := func(what string) error { return fmt.Errorf("%w: %s (%d bytes)", errStoredFormat, what, len(b)) }
	switch {
	case len(b) == 0:
		return nil, bad("empty")
	case b[0] != storedVersion:
		return nil, bad(fmt.Sprintf("format version %d, which this version of pgdedup/idempotency cannot read", b[0]))
	case len(b) < 4:
		return nil, bad("truncated status")
	}
	resp := &response{status: int(binary.BigEndian.Uint16(b[2:4])), header: http.Header{}, omitted: b[1]&flagBodyOmitted != 0}
	if b[1]&^flagBodyOmitted != 0 || resp.status < 100 || resp.status > 999 {
		return nil, bad(fmt.Sprintf("flags %#x, status %d", b[1], resp.status))
	}
	rest := b[4:]
	// next reads a uvarint no greater than what remains, a bound on any count
	// or length.
	next := func() (int, bool) {
		v, n := binary.Uvarint(rest)
		if n <= 0 || v > uint64(len(rest)-n) {
			return 0, false
		}
		rest = rest[n:]
		return int(v), true
	}
	text := func() (string, bool) {
		n, ok := next()
		if !ok {
			return "", false
		}
		s := string(rest[:n])
		rest = rest[n:]
		return s, true
	}
	headers, ok := next()
	for i := 0; ok && i < headers; i++ {
		var k string
		var values int
		if k, ok = text(); ok {
			values, ok = next()
		}
		vs := make([]string, 0, min(values, len(rest)))
		for j := 0; ok && j < values; j++ {
			var v string
			v, ok = text()
			vs = append(vs, v)
		}
		resp.header[k] = vs
	}
	if !ok {
		return nil, bad("truncated headers")
	}
	resp.body = append([]byte{}, rest...)
	if resp.omitted && len(resp.body) > 0 {
		return nil, bad("a body marked omitted")
	}
	return resp, nil
}
