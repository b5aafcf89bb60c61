package idempotency

import (
	"encoding/json"
	"net/http"
)

// problemDetails is an RFC 9457 problem. The type is about:blank, so the
// status says what kind of problem it is and detail says what to do.
type problemDetails struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// ProblemContentType is the media type of the middleware's own error answers.
const ProblemContentType = "application/problem+json"

// problem answers with status and an application/problem+json body. These
// answers are never stored, so a client can fix its request and send it again.
func problem(w http.ResponseWriter, status int, detail string) {
	body, _ := json.Marshal(problemDetails{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail})
	h := w.Header()
	h.Set("Content-Type", ProblemContentType)
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
