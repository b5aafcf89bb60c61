package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
)

// The ways the handler's transaction ends in a rollback that is not a failure
// of the database; fn returns them so that Process rolls back.
var (
	errHandlerFailed = errors.New("idempotency: handler answered 5xx")
	errNotCommitted  = errors.New("idempotency: handler answered 4xx, whose writes are not committed")
	errAborted       = errors.New("idempotency: a statement failed in idempotency.Tx and was not rolled back to a savepoint")
	errEndedBySQL    = errors.New("idempotency: the handler ended idempotency.Tx with a COMMIT or ROLLBACK statement")
)

// Wrap returns next made idempotent by the request's key.
//
// The first request with a key runs next in a transaction (see [Tx]) that also
// claims the key; if next answers below 400, its status, ReplayHeaders and body
// are stored with the key in that transaction, which commits before the
// response is sent (4xx: see [Config.ClientErrors]). A 5xx answer or a panic
// rolls everything back, so a retry runs next again. A later request with the
// key and the same fingerprint gets the stored response with ReplayedHeader,
// without calling next; with another fingerprint it gets 422. The response is
// buffered, so next cannot stream, flush or hijack the connection. Requests
// whose method is in [Config.SafeMethods] go straight to next.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

// WrapFunc is Wrap for a handler that returns an error. A non-nil error rolls
// the transaction back like a 5xx answer, discards what fn wrote and answers
// 500 (503 with Retry-After when pgdedup.IsTransient), logging the error; a
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
	if r.ContentLength > m.cfg.MaxRequestBody {
		m.problem(w, http.StatusRequestEntityTooLarge, bodyTooLarge, bodyTooLargeDetail(m.cfg.MaxRequestBody))
		return
	}

	waitUntil := time.Now().Add(m.cfg.InFlightWait)
	for {
		fl, lead, canWait := m.flights.join(id, m.cfg.MaxWaitersPerKey)
		if lead {
			var kept *response
			defer func() { m.flights.finish(id, fl, kept) }() // also when next panics
			kept = m.lead(w, r, next, id)
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
			m.replayKept(w, r, id, fl.kept)
			return
		}
		// The request in flight kept no answer: claim the key ourselves.
	}
}

// await waits for fl to end, until deadline; ended is false if it did not.
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
func (m *Middleware) replayKept(w http.ResponseWriter, r *http.Request, id string, kept *response) {
	body, ok := m.readBody(w, r)
	if !ok {
		return
	}
	if !bytes.Equal(kept.fingerprint, m.fingerprint(r, body)) {
		m.keyReused(w)
		return
	}
	if kept.sealed {
		// Replay what a lookup would: the body as StoredBody opens it.
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

// lead serves the first request of a key in this process: it takes a turn on
// the database, reads the body, claims the key and runs next, or replays the
// key's stored answer. It returns the answer kept for the key, for the
// requests waiting on the same key, or nil.
func (m *Middleware) lead(w http.ResponseWriter, r *http.Request, next http.Handler, id string) *response {
	release, ok := m.acquire(r.Context())
	if !ok {
		m.busy(w, r)
		return nil
	}
	defer release()
	body, ok := m.readBody(w, r)
	if !ok {
		return nil
	}
	fp := m.fingerprint(r, body)

	// A key found as a duplicate can expire and be cleaned before it is looked
	// up; then it is claimed again, as a new key.
	for range 3 {
		rec, processed, err := m.process(r, next, id, fp, body)
		if done, kept := m.answer(w, r, id, fp, rec, processed, err); done {
			return kept
		}
		stored, found, err := m.load(r.Context(), id)
		switch {
		case err != nil:
			m.fail(w, r, err)
			return nil
		case !found:
			continue
		case stored.expired:
			m.problem(w, http.StatusUnprocessableEntity, keyExpired, fmt.Sprintf("This %s was first used more than %s ago and has expired: its answer is no longer kept. Use a new key for a new request.", m.cfg.Header, formatDuration(m.store.Retention())))
			return nil
		case stored.status == 0:
			m.keyReused(w) // a message ID of another use of this Consumer name
			return nil
		case !bytes.Equal(stored.fingerprint, fp):
			m.keyReused(w)
			return stored
		}
		stored.send(w, true)
		return stored
	}
	m.fail(w, r, errors.New("idempotency: key kept expiring between claim and lookup"))
	return nil
}

// answer sends what process's outcome calls for, unless the key was a
// duplicate whose stored answer is still to be loaded (done is false).
func (m *Middleware) answer(w http.ResponseWriter, r *http.Request, id string, fp []byte, rec *recorder, processed bool, err error) (done bool, kept *response) {
	var resp *response
	if rec != nil {
		resp = rec.response()
	}
	rolledBack := errors.Is(err, errHandlerFailed) || errors.Is(err, errNotCommitted) || errors.Is(err, errAborted)
	switch {
	case rolledBack && resp.status >= 500:
		resp.send(w, false)
	case rolledBack && resp.status >= 400:
		return true, m.answerClientError(w, r, id, fp, resp)
	case errors.Is(err, errAborted):
		m.log.ErrorContext(r.Context(), "idempotency: a statement failed in idempotency.Tx, and the handler then answered "+
			fmt.Sprint(resp.status)+": nothing was committed, the request got 500; roll back to a savepoint (tx.Begin) "+
			"around a statement that may fail, or answer 4xx or 5xx", "consumer", m.store.Consumer())
		m.failed(w)
	case errors.Is(err, ErrTxManaged), errors.Is(err, errEndedBySQL):
		m.log.ErrorContext(r.Context(), err.Error(), "consumer", m.store.Consumer())
		m.failed(w)
	case errors.Is(err, pgdedup.ErrInFlight):
		m.inFlight(w)
	case err != nil:
		m.fail(w, r, err)
	case processed:
		resp.send(w, false)
		return true, resp.stored
	default:
		return false, nil
	}
	return true, nil
}

// answerClientError sends a 4xx answer whose writes were rolled back, after
// keeping it for replay in a transaction of its own when the Config says so.
func (m *Middleware) answerClientError(w http.ResponseWriter, r *http.Request, id string, fp []byte, resp *response) *response {
	var kept *response
	if m.keeps(resp.status) {
		ok, err := m.keepAnswer(r.Context(), id, fp, resp)
		switch {
		case err != nil:
			m.log.WarnContext(r.Context(), "idempotency: a 4xx answer was sent without being kept", "consumer", m.store.Consumer(), "error", err)
		case ok:
			kept = resp.stored
		}
	}
	resp.send(w, false)
	return kept
}

// keeps reports whether a 4xx answer is kept for replay.
func (m *Middleware) keeps(status int) bool {
	return m.cfg.ClientErrors != ForgetClientErrors && !m.notKept[status]
}

// commits reports whether the writes of an answer with status commit.
func (m *Middleware) commits(status int) bool {
	switch {
	case status < 400:
		return true
	case status < 500:
		return m.cfg.ClientErrors == CommitClientErrors && !m.notKept[status]
	}
	return false
}

// process claims id and, when it is new, runs next and stores its response, all
// in one transaction. pgdedup.Store.Process retries transient failures, so next
// may run more than once, each time in a fresh transaction.
func (m *Middleware) process(r *http.Request, next http.Handler, id string, fp, body []byte) (rec *recorder, processed bool, err error) {
	processed, err = m.store.Process(r.Context(), id, func(ctx context.Context, tx pgx.Tx) error {
		rec = newRecorder()
		if err := m.run(rec, r, next, tx, body); err != nil {
			return err
		}
		resp := rec.response()
		switch {
		case resp.status >= 500:
			return errHandlerFailed
		case !m.commits(resp.status):
			return errNotCommitted
		}
		return m.save(ctx, tx, id, fp, resp)
	})
	return rec, processed, err
}

// run runs next in tx and reports how the handler left the transaction: an
// error if it must not commit whatever next answered.
func (m *Middleware) run(rec *recorder, r *http.Request, next http.Handler, tx pgx.Tx, body []byte) error {
	htx := &handlerTx{Tx: tx}
	req := withTx(r, htx)
	if body != nil {
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	next.ServeHTTP(rec, req)
	switch {
	case htx.ended.Load():
		return ErrTxManaged
	case rec.err != nil:
		return rec.err
	}
	switch txState(tx) {
	case 'I':
		return errEndedBySQL
	case 'E':
		return errAborted
	}
	return nil
}

// serveWithoutKey runs next in a plain transaction, for Config.Optional.
func (m *Middleware) serveWithoutKey(w http.ResponseWriter, r *http.Request, next http.Handler) {
	release, ok := m.acquire(r.Context())
	if !ok {
		m.busy(w, r)
		return
	}
	defer release()
	ctx := r.Context()
	tx, err := m.db.BeginTx(ctx, m.cfg.Store.TxOptions)
	if err != nil {
		m.fail(w, r, fmt.Errorf("idempotency: begin: %w", err))
		return
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	rec := newRecorder()
	err = m.run(rec, r, next, tx, nil)
	resp := rec.response()
	switch {
	case errors.Is(err, errAborted) && resp.status >= 400:
	case errors.Is(err, errAborted), errors.Is(err, ErrTxManaged), errors.Is(err, errEndedBySQL):
		m.answer(w, r, "", nil, rec, false, err)
		return
	case err != nil:
		m.fail(w, r, err)
		return
	case m.commits(resp.status):
		if err := tx.Commit(ctx); err != nil {
			m.fail(w, r, fmt.Errorf("idempotency: commit: %w", err))
			return
		}
	}
	resp.send(w, false)
}

// readBody reads the request's body for fingerprinting, or answers the
// request with why it cannot.
func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request) (body []byte, ok bool) {
	body, status, detail := readBody(r, m.cfg.MaxRequestBody)
	switch status {
	case 0:
		return body, true
	case http.StatusRequestEntityTooLarge:
		m.problem(w, status, bodyTooLarge, detail)
	default:
		m.problem(w, status, otherProblem, detail)
	}
	return nil, false
}

func (m *Middleware) inFlight(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	m.problem(w, http.StatusConflict, keyInFlight, fmt.Sprintf("A request with this %s is still being processed. Retry it later to get its response.", m.cfg.Header))
}

func (m *Middleware) keyReused(w http.ResponseWriter) {
	m.problem(w, http.StatusUnprocessableEntity, keyReused, fmt.Sprintf("This %s was already used for a different request (another method, URL or body). Use a new key for a new request.", m.cfg.Header))
}

// busy answers a request that got no turn on the database (MaxInFlight)
// within AcquireTimeout. Nothing was read or processed.
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
// database. A transient failure (503) is worth retrying with the same key:
// nothing was committed, or, after a commit whose outcome was lost, the retry
// finds the key and gets its answer. Any other failure gets 500 and no such
// promise: the same request would likely fail the same way.
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
