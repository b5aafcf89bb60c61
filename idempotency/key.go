package idempotency

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
)

// validateKey accepts 1 to maxLen bytes of visible ASCII. Spaces are excluded,
// which keeps a scoped ID (scope hash, space, key) unambiguous. A quoted
// String may hold a space, and gets 400.
func validateKey(key string, maxLen int) error {
	if len(key) > maxLen {
		return fmt.Errorf("%d bytes, longer than %d", len(key), maxLen)
	}
	if key == "" {
		return errors.New("empty")
	}
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case c == ' ':
			return fmt.Errorf("it holds a space (at byte %d); this API's keys are visible ASCII without spaces, such as a UUID", i)
		case c < 0x21 || c > 0x7e:
			return fmt.Errorf("byte %d is %q; use visible ASCII only (letters, digits, punctuation, no spaces), such as a UUID", i, c)
		}
	}
	return nil
}

// readBody reads the whole request body, at most limit bytes. On failure it
// returns the status to answer with and a detail for the client. Status 0 is
// success.
func readBody(r *http.Request, limit int64) (body []byte, status int, detail string) {
	if r.Body == nil {
		return []byte{}, 0, ""
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, http.StatusRequestTimeout, "The request body did not arrive in time. Nothing was processed."
	case err != nil:
		return nil, http.StatusBadRequest, "The request body could not be read."
	}
	if int64(len(body)) > limit {
		return nil, http.StatusRequestEntityTooLarge, bodyTooLargeDetail(limit)
	}
	return body, 0, ""
}

func bodyTooLargeDetail(limit int64) string {
	return fmt.Sprintf("The request body is larger than %d bytes, the most this endpoint accepts.", limit)
}
