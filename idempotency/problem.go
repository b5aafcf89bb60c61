package idempotency

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/pgdedup/pgdedup"
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
// middleware adds). Its anchor names its section of the documentation page,
// and the problem's type is Config.DocsURL + "#" + anchor.
type problemKind struct {
	anchor string
	title  string // after the header name
}

var (
	missingKey   = problemKind{"missing-key", " is missing"}
	invalidKey   = problemKind{"invalid-key", " is invalid"}
	keyReused    = problemKind{"key-reused", " is already used"}
	keyInFlight  = problemKind{"key-in-flight", ": a request is outstanding for this key"}
	bodyTooLarge = problemKind{"body-too-large", ": the request body is too large"}
	// otherProblem is not about the key's use. It is an unreadable body or a
	// database failure, say. Its type is about:blank and it links nowhere.
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

func (m *Middleware) inFlight(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	m.problem(w, http.StatusConflict, keyInFlight, fmt.Sprintf("A request with this %s is still being processed. Retry it later to get its response.", m.cfg.Header))
}

func (m *Middleware) keyReused(w http.ResponseWriter) {
	m.problem(w, http.StatusUnprocessableEntity, keyReused, fmt.Sprintf("This %s was already used for a different request (another method, URL or body). Use a new key for a new request.", m.cfg.Header))
}

// busy answers a request that got no turn on the database (MaxInFlight)
// within AcquireTimeout. Nothing was processed.
func (m *Middleware) busy(w http.ResponseWriter, r *http.Request) {
	if r.Context().Err() != nil {
		return // the client is gone
	}
	w.Header().Set("Retry-After", "1")
	m.problem(w, http.StatusServiceUnavailable, otherProblem, fmt.Sprintf("The server is busy and did not process this request. Retry it later with the same %s.", m.cfg.Header))
}

// failed answers a request that failed on the server for a reason a retry
// does not cure. Nothing was committed.
func (m *Middleware) failed(w http.ResponseWriter) {
	m.problem(w, http.StatusInternalServerError, otherProblem, "The request failed because of an error on the server. Nothing was recorded.")
}

// fail answers a request that could not be completed because of the
// database. A transient failure (503) is worth retrying with the same key.
// Either nothing was committed, or the commit's outcome was lost and the
// retry finds the key and gets its answer. Any other failure gets 500 and no
// such promise, since the same request would likely fail the same way.
func (m *Middleware) fail(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client is gone
	}
	if pgdedup.IsTransient(err) {
		m.log.WarnContext(r.Context(), "idempotency: request failed", "consumer", m.store.Consumer(), "error", err)
		w.Header().Set("Retry-After", "1")
		m.problem(w, http.StatusServiceUnavailable, otherProblem, fmt.Sprintf("The request could not be completed because the database was unavailable. Retry it with the same %s: if it was completed, the retry gets its answer.", m.cfg.Header))
		return
	}
	m.log.ErrorContext(r.Context(), "idempotency: request failed", "consumer", m.store.Consumer(), "error", err)
	m.problem(w, http.StatusInternalServerError, otherProblem, "The request could not be completed because of an error on the server.")
}
