package idempotency

import (
	"encoding/json"
	"net/http"
)

// problemDetails is an RFC 9457 problem.
type problemDetails struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// ProblemContentType is the media type of the middleware's own error answers.
const ProblemContentType = "application/problem+json"

// A problemKind is one of the errors the draft's §2.7 describes (or this
// middleware adds). Its anchor names its section of the documentation page:
// the problem's type is Config.DocsURL + "#" + anchor.
type problemKind struct {
	anchor string
	title  string // after the header name
}

var (
	missingKey   = problemKind{"missing-key", " is missing"}
	invalidKey   = problemKind{"invalid-key", " is invalid"}
	keyReused    = problemKind{"key-reused", " is already used"}
	keyExpired   = problemKind{"key-expired", " has expired"}
	keyInFlight  = problemKind{"key-in-flight", ": a request is outstanding for this key"}
	bodyTooLarge = problemKind{"body-too-large", ": the request body is too large"}
	// otherProblem is not about the key's use (an unreadable body, a
	// database failure): its type is about:blank and it links nowhere.
	otherProblem = problemKind{}
)

// problem answers with status and an application/problem+json body whose type
// is kind's section of the documentation, which a Link with rel="describedby"
// also points to (draft §2.7). These answers are never stored, so a client can
// fix its request and send it again.
func (m *Middleware) problem(w http.ResponseWriter, status int, kind problemKind, detail string) {
	p := problemDetails{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail}
	h := w.Header()
	if kind.anchor != "" {
		p.Type = m.cfg.DocsURL + "#" + kind.anchor
		p.Title = m.cfg.Header + kind.title
		h.Set("Link", "<"+m.cfg.DocsURL+`>; rel="describedby"; type="text/html"`)
	}
	body, _ := json.Marshal(p)
	h.Set("Content-Type", ProblemContentType)
	h.Set("Content-Language", "en")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
