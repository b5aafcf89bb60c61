package idempotency

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/pgdedup/pgdedup"
)

// Wrap returns next made idempotent by the request's key.
//
// The first request with a key runs next in a transaction (see [Tx]) that also
// claims the key. If next answers below 400, its status, ReplayHeaders and
// body are stored with the key in that transaction, which commits before the
// response is sent. For 4xx, see [Config.ClientErrors]. A 5xx answer or a
// panic rolls everything back, so a retry runs next again. A later request
// with the key and the same fingerprint gets the stored response with
// ReplayedHeader, without calling next. With another fingerprint it gets 422.
// The response is buffered, so next cannot stream, flush or hijack the
// connection. Requests whose method is in [Config.SafeMethods] go straight to
// next.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

// WrapFunc is Wrap for a handler that returns an error. A non-nil error rolls
// the transaction back like a 5xx answer, discards what fn wrote, logs the
// error and answers 500, or 503 with Retry-After when pgdedup.IsTransient. A
// transient error first re-runs fn in a new transaction, up to
// Config.Store.MaxAttempts.
func (m *Middleware) WrapFunc(fn func(w http.ResponseWriter, r *http.Request) error) http.Handler {
	return m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := fn(w, r); err != nil {
			if rec, ok := w.(*recorder); ok {
				rec.err = err
			}
		}
	}))
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if m.safe[r.Method] {
		next.ServeHTTP(w, r)
		return
	}
	keys := r.Header.Values(m.cfg.Header)
	switch {
	case len(keys) == 0 && m.cfg.Optional:
		m.serveWithoutKey(w, r, next)
		return
	case len(keys) == 0:
		m.problem(w, http.StatusBadRequest, missingKey, fmt.Sprintf("This request needs an %s header: a key of your choosing, unique per operation, sent again only when retrying that operation.", m.cfg.Header))
		return
	case len(keys) > 1:
		m.problem(w, http.StatusBadRequest, invalidKey, fmt.Sprintf("Send exactly one %s header, not %d.", m.cfg.Header, len(keys)))
		return
	}
	key, err := parseKeyHeader(keys[0], m.cfg.MaxKeyLen)
	if err != nil {
		m.problem(w, http.StatusBadRequest, invalidKey, fmt.Sprintf("Invalid %s header: %s.", m.cfg.Header, err))
		return
	}
	id, ok := m.scopedID(r, key)
	if !ok {
		m.log.ErrorContext(r.Context(), "idempotency: Config.Scope returned \"\": the request was refused, "+
			"since its key cannot be kept apart from other clients'; authentication must run before this middleware",
			"consumer", m.store.Consumer(), "method", r.Method, "path", r.URL.Path)
		m.problem(w, http.StatusInternalServerError, otherProblem, "The server could not tell who sent this request, so it did not process it.")
		return
	}
	// The body is read before the request takes a turn on the database or
	// waits for its key, so a client that sends it slowly holds only its
	// own goroutine.
	body, ok := m.readBody(w, r)
	if !ok {
		return
	}

	waitUntil := time.Now().Add(m.cfg.InFlightWait)
	for {
		fl, lead, canWait := m.flights.join(id, m.cfg.MaxWaitersPerKey)
		if lead {
			lw := &leaderWriter{ResponseWriter: w, end: func(kept *response) { m.flights.finish(id, fl, kept) }}
			defer lw.endFlight() // also when next panics, or nothing was sent
			m.lead(lw, r, next, id, body)
			return
		}
		if !canWait || m.cfg.InFlightWait == 0 {
			m.inFlight(w)
			return
		}
		ended := m.await(r.Context(), fl, waitUntil)
		m.flights.leave(fl)
		switch {
		case r.Context().Err() != nil:
			return // the client is gone
		case !ended:
			m.inFlight(w)
			return
		case fl.kept != nil:
			m.replayKept(w, r, id, fl.kept, body)
			return
		}
		// The request in flight kept no answer, so claim the key ourselves.
	}
}

// await waits for fl to end, until deadline. ended is false if it did not.
func (m *Middleware) await(ctx context.Context, fl *flight, deadline time.Time) (ended bool) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-fl.done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// replayKept answers a request that waited in memory for another request with
// the same key, from the answer that request kept.
func (m *Middleware) replayKept(w http.ResponseWriter, r *http.Request, id string, kept *response, body []byte) {
	if !bytes.Equal(kept.fingerprint, m.fingerprint(r, body)) {
		m.keyReused(w)
		return
	}
	if kept.sealed {
		// Replay what a lookup would, the body as StoredBody opens it.
		opened := *kept
		var err error
		if opened.body, err = m.cfg.StoredBody.Open(pgdedup.Key(m.store.Consumer(), id), kept.status, kept.body); err != nil {
			m.fail(w, r, fmt.Errorf("%w: %w", errStoredBody, err))
			return
		}
		kept = &opened
	}
	kept.send(w, true)
}

// lead serves the first request of a key in this process, whose body was
// read. It takes a turn on the database, claims the key and runs next, or
// replays the key's stored answer. The answer kept for the key, for the
// requests waiting on the same key, is recorded in w before it is sent (see
// keep).
func (m *Middleware) lead(w *leaderWriter, r *http.Request, next http.Handler, id string, body []byte) {
	release, ok := m.acquire(r.Context())
	if !ok {
		m.busy(w, r)
		return
	}
	w.release = release
	fp := m.fingerprint(r, body)
	rec, result, processed, err := m.process(r, next, id, fp, body)
	if m.answer(w, r, id, fp, rec, processed, err) {
		return
	}
	stored, err := m.replayed(id, fp, result)
	switch {
	case err != nil:
		m.fail(w, r, err)
		return
	case stored.status == 0:
		m.keyReused(w) // a message ID of another use of this Consumer name
		return
	}
	keep(w, stored)
	stored.send(w, true)
}

// leaderWriter is the ResponseWriter of the request that leads its key's
// flight. Its flight ends, and its turn on the database is given back,
// before the first byte of its answer is written. By then the key's
// transaction has ended. So a client that reads the answer and sends the key
// again at once finds the key free, and its stored answer, instead of the
// flight in progress (409). A large body is written to the connection while
// the handler still runs.
type leaderWriter struct {
	http.ResponseWriter
	end     func(kept *response) // ends the flight with the kept answer
	release func()               // gives the turn back, if one was taken
	kept    *response
	ended   bool
}

// keep records kept as the answer of w's flight, if w leads one, for the
// requests waiting on the same key. It is called before the answer is sent.
func keep(w http.ResponseWriter, kept *response) {
	if lw, ok := w.(*leaderWriter); ok {
		lw.kept = kept
	}
}

// endFlight gives the turn back and ends the flight, once.
func (w *leaderWriter) endFlight() {
	if w.ended {
		return
	}
	w.ended = true
	if w.release != nil {
		w.release()
	}
	w.end(w.kept)
}

func (w *leaderWriter) WriteHeader(status int) {
	w.endFlight()
	w.ResponseWriter.WriteHeader(status)
}

func (w *leaderWriter) Write(b []byte) (int, error) {
	w.endFlight()
	return w.ResponseWriter.Write(b)
}

// Unwrap returns the ResponseWriter under w, for http.ResponseController.
func (w *leaderWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// readBody reads the request's body whole, at most MaxRequestBody bytes
// within RequestBodyTimeout, or answers the request with why it cannot.
func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request) (body []byte, ok bool) {
	if r.ContentLength > m.cfg.MaxRequestBody {
		m.problem(w, http.StatusRequestEntityTooLarge, bodyTooLarge, bodyTooLargeDetail(m.cfg.MaxRequestBody))
		return nil, false
	}
	clear := m.readDeadline(w, r)
	body, status, detail := readBody(r, m.cfg.MaxRequestBody)
	switch status {
	case 0:
		clear()
		return body, true
	case http.StatusRequestEntityTooLarge:
		m.problem(w, status, bodyTooLarge, detail)
	default:
		m.problem(w, status, otherProblem, detail)
	}
	return nil, false
}

// readDeadline sets the connection's read deadline RequestBodyTimeout from
// now, or the server's ReadTimeout if that is shorter. clear removes it,
// once the body is read whole. After a failed read the deadline stays. The
// server then discards what is left of the body before closing, and a client
// that stopped sending would otherwise hold that up forever.
func (m *Middleware) readDeadline(w http.ResponseWriter, r *http.Request) (clear func()) {
	noop := func() {}
	timeout := m.cfg.RequestBodyTimeout
	if timeout < 0 || r.Body == nil || r.Body == http.NoBody {
		return noop
	}
	if srv, ok := r.Context().Value(http.ServerContextKey).(*http.Server); ok && srv.ReadTimeout > 0 {
		timeout = min(timeout, srv.ReadTimeout)
	}
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(timeout)) != nil {
		return noop // a ResponseWriter that does not reach net/http's
	}
	// The deadline is for the body only. net/http's HTTP/1 server also
	// clears it before reading ahead for the next request, but not every
	// server does.
	return func() { _ = rc.SetReadDeadline(time.Time{}) }
}
