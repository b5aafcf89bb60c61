package pgdedup

import (
	"fmt"
	"strconv"
)

// PayloadMismatchError is the error of a call with [WithFingerprint] whose
// message ID is recorded with a different fingerprint: the ID was reused for
// another payload. errors.Is(err, [ErrPayloadMismatch]) reports it.
//
// Stored and Given are there for programs that compare them. Do not log or
// trace them: an unkeyed hash of a guessable payload (a PIN, an amount)
// gives the payload away to whoever tries every candidate. Key the
// fingerprints ([WithFingerprint]) where payloads are guessable.
type PayloadMismatchError struct {
	MessageID string
	Stored    []byte // the fingerprint recorded with the ID, by its first delivery
	Given     []byte // the fingerprint of this delivery
}

// Error names the ID, and neither fingerprint, so that logs and traces of the
// error never carry a digest of a payload.
func (e *PayloadMismatchError) Error() string {
	return fmt.Sprintf("%s: %s: recorded with another fingerprint", ErrPayloadMismatch, strconv.Quote(e.MessageID))
}

// Is reports whether target is [ErrPayloadMismatch].
func (e *PayloadMismatchError) Is(target error) bool { return target == ErrPayloadMismatch }
