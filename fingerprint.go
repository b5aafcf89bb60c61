package pgdedup

import (
	"fmt"
	"strconv"
)

// PayloadMismatchError is the error of a call with [WithFingerprint] whose
// message ID is recorded with a different fingerprint: the ID was reused for
// another payload. errors.Is(err, [ErrPayloadMismatch]) reports it.
type PayloadMismatchError struct {
	MessageID string
	Stored    []byte // the fingerprint recorded with the ID
	Given     []byte // the fingerprint of this delivery
}

// Error names the ID and both fingerprints, in hex.
func (e *PayloadMismatchError) Error() string {
	return fmt.Sprintf("%s: %s: fingerprint %x, recorded with %x", ErrPayloadMismatch, strconv.Quote(e.MessageID), e.Given, e.Stored)
}

// Is reports whether target is [ErrPayloadMismatch].
func (e *PayloadMismatchError) Is(target error) bool { return target == ErrPayloadMismatch }
