package idempotency

import (
	"bytes"
	"net/http"
	"strconv"
)

// recorder is the http.ResponseWriter the handler writes to. It keeps the
// response in memory until the transaction has committed.
type recorder struct {
	header http.Header
	sent   http.Header // header as of WriteHeader, as net/http would send it
	status int
	body   bytes.Buffer
	err    error // returned by a WrapFunc handler
}

func newRecorder() *recorder { return &recorder{header: http.Header{}} }

func (rec *recorder) Header() http.Header { return rec.header }

// WriteHeader records the first final status. Informational (1xx) responses
// cannot be buffered meaningfully and are dropped.
func (rec *recorder) WriteHeader(status int) {
	if rec.status != 0 || (status >= 100 && status < 200) {
		return
	}
	rec.status = status
	rec.sent = rec.header.Clone()
}

func (rec *recorder) Write(p []byte) (int, error) {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	return rec.body.Write(p)
}

// response returns what the handler answered, with net/http's defaults made
// explicit (status 200, a sniffed Content-Type), so that the first answer and
// its replays agree.
func (rec *recorder) response() *response {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	h := rec.sent.Clone()
	body := bytes.Clone(rec.body.Bytes())
	if body == nil {
		body = []byte{}
	}
	if _, ok := h["Content-Type"]; !ok && len(body) > 0 {
		h.Set("Content-Type", http.DetectContentType(body))
	}
	return &response{status: rec.status, header: h, body: body}
}

// response is a response as sent, or as stored with a key.
type response struct {
	fingerprint []byte // stored responses only
	status      int
	header      http.Header
	body        []byte    // empty, not nil, when omitted
	omitted     bool      // the body was not stored (see BodyOmittedHeader)
	sealed      bool      // body is what Config.StoredBody sealed, to open before a replay
	stored      *response // what save stored of this response, once it has
}

// forStorage returns the part of resp that is stored. That is the headers in
// keep, and the body unless it is longer than maxBody. A longer body is nil
// and is not stored.
func (resp *response) forStorage(keep []string, maxBody int) *response {
	out := &response{status: resp.status, header: http.Header{}, body: resp.body}
	for _, k := range keep {
		if v := resp.header.Values(k); len(v) > 0 {
			out.header[http.CanonicalHeaderKey(k)] = v
		}
	}
	if len(resp.body) > maxBody {
		out.body, out.omitted = nil, true
	}
	return out
}

// send writes resp to w, marked as a replay when replay is true.
func (resp *response) send(w http.ResponseWriter, replay bool) {
	h := w.Header()
	for k, v := range resp.header {
		h[k] = v
	}
	body := resp.body
	if replay {
		h.Set(ReplayedHeader, "true")
		if resp.omitted {
			h.Set(BodyOmittedHeader, "true")
			body = nil
		}
	}
	if bodyAllowed(resp.status) {
		h.Set("Content-Length", strconv.Itoa(len(body)))
	} else {
		h.Del("Content-Length")
		body = nil
	}
	w.WriteHeader(resp.status)
	_, _ = w.Write(body) // a client that went away cannot be told
}

// bodyAllowed reports whether a response with status may have a body (RFC 9110).
func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified
}
