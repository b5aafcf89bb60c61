package idempotency

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
)

// scopeHashLen is the length of a scope's hash in a message ID, 128 bits in
// hex. Two scopes sharing an ID is negligible (about 10⁻²¹ at 10⁹ scopes).
const scopeHashLen = 32

// deriveKeys returns the HMAC keys of scopes and fingerprints, apart from each
// other, so that neither hash can stand for the other.
func deriveKeys(secret []byte) (scopeKey, fpKey []byte) {
	derive := func(label string) []byte {
		h := hmac.New(sha256.New, secret)
		h.Write([]byte("pgdedup/idempotency " + label))
		return h.Sum(nil)
	}
	return derive("scope"), derive("fingerprint")
}

// scopedID returns the message ID a key is recorded under and whether the
// request may go on. With GlobalScope the ID is the key alone. Otherwise it
// is the HMAC of the scope, a space and the key. So the scope, whatever its
// length or bytes, never reaches the table, the logs or telemetry, and the ID
// stays short and valid. A Scope that returns "" fails closed (ok is false).
// Without an identity, the key cannot be kept apart from other clients'.
func (m *Middleware) scopedID(r *http.Request, key string) (id string, ok bool) {
	if m.cfg.GlobalScope {
		return key, true
	}
	scope := m.cfg.Scope(r)
	if scope == "" {
		return "", false
	}
	h := hmac.New(sha256.New, m.scopeKey)
	h.Write([]byte(scope))
	return hex.EncodeToString(h.Sum(nil))[:scopeHashLen] + " " + key, true
}

// fingerprint returns the keyed hash stored with a key. It covers the method,
// the path and Config.Fingerprint's result (by default the query and the
// body). The method and path are always in it, so that a Fingerprint that
// looks at the body alone cannot replay one endpoint's answer on another (a
// refund answered with a charge). Each part is length-prefixed, so no two
// different requests feed the same bytes to the HMAC.
func (m *Middleware) fingerprint(r *http.Request, body []byte) []byte {
	h := hmac.New(sha256.New, m.fpKey)
	for _, part := range [][]byte{[]byte(r.Method), []byte(r.URL.EscapedPath()), m.fingerprintPart(r, body)} {
		var n [8]byte
		for i, l := 0, uint64(len(part)); i < 8; i++ {
			n[i] = byte(l >> (8 * i))
		}
		h.Write(n[:])
		h.Write(part)
	}
	return h.Sum(nil)
}

func (m *Middleware) fingerprintPart(r *http.Request, body []byte) []byte {
	if m.cfg.Fingerprint != nil {
		return []byte(m.cfg.Fingerprint(r, body))
	}
	part := make([]byte, 0, len(r.URL.RawQuery)+1+len(body))
	part = append(part, r.URL.RawQuery...)
	part = append(part, '\n')
	return append(part, body...)
}
