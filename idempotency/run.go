package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
)

// The ways the handler's transaction ends in a rollback that is not a failure
// of the database. fn returns them so that Process rolls back.
var (
	errHandlerFailed = errors.New("idempotency: handler answered 5xx")
	errNotCommitted  = errors.New("idempotency: handler answered 4xx, whose writes are not committed")
	errAborted       = errors.New("idempotency: a statement failed in idempotency.Tx and was not rolled back to a savepoint")
	errEndedBySQL    = errors.New("idempotency: the handler ended idempotency.Tx with a COMMIT or ROLLBACK statement")
)

// answer sends what process's outcome calls for, unless the key was a
// duplicate whose stored answer is still to be loaded (done is false). An
// answer kept for replay is recorded with keep before it is sent.
func (m *Middleware) answer(w http.ResponseWriter, r *http.Request, id string, fp []byte, rec *recorder, processed bool, err error) (done bool) {
	var resp *response
	if rec != nil {
		resp = rec.response()
	}
	rolledBack := errors.Is(err, errHandlerFailed) || errors.Is(err, errNotCommitted) || errors.Is(err, errAborted)
	switch {
	case rolledBack && resp.status >= 500:
		resp.send(w, false)
	case rolledBack && resp.status >= 400:
		m.answerClientError(w, r, id, fp, resp)
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
	case errors.Is(err, pgdedup.ErrPayloadMismatch):
		m.keyReused(w)
	case err != nil:
		m.fail(w, r, err)
	case processed:
		keep(w, resp.stored)
		resp.send(w, false)
	default:
		return false
	}
	return true
}

// answerClientError sends a 4xx answer whose writes were rolled back, after
// keeping it for replay in a transaction of its own when the Config says so.
func (m *Middleware) answerClientError(w http.ResponseWriter, r *http.Request, id string, fp []byte, resp *response) {
	var kept *response
	if m.keeps(resp.status) {
		ok, err := m.keepAnswer(r.Context(), id, fp, resp)
		switch {
		case errors.Is(err, pgdedup.ErrPayloadMismatch):
			// Another request holds the key, so there is nothing to keep.
		case err != nil:
			m.log.WarnContext(r.Context(), "idempotency: a 4xx answer was sent without being kept", "consumer", m.store.Consumer(), "error", err)
		case ok:
			kept = resp.stored
		}
	}
	keep(w, kept)
	resp.send(w, false)
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
// in one transaction. pgdedup.Store.ProcessResult retries transient failures,
// so next may run more than once, each time in a fresh transaction. For a
// duplicate, result is the stored answer (nil if there is none in the result
// column).
func (m *Middleware) process(r *http.Request, next http.Handler, id string, fp, body []byte) (rec *recorder, result []byte, processed bool, err error) {
	result, processed, err = m.store.ProcessResult(r.Context(), id, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		rec = newRecorder()
		if err := m.run(rec, r, next, tx, body); err != nil {
			return nil, err
		}
		resp := rec.response()
		switch {
		case resp.status >= 500:
			return nil, errHandlerFailed
		case !m.commits(resp.status):
			return nil, errNotCommitted
		}
		return m.encode(id, fp, resp)
	}, m.claimOptions(fp)...)
	if errors.Is(err, pgdedup.ErrResultTooLarge) {
		err = fmt.Errorf("idempotency: the response's status, ReplayHeaders and what StoredBody added to its body "+
			"take more than the %d bytes a stored response may hold besides MaxStoredBody: %w", storedOverhead, err)
	}
	return rec, result, processed, err
}

// run runs next in tx and reports how the handler left the transaction. It
// returns an error if the transaction must not commit, whatever next answered.
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

// serveWithoutKey runs next in a plain transaction, for Config.Optional. As
// with a key, the body is read before the request takes a turn.
func (m *Middleware) serveWithoutKey(w http.ResponseWriter, r *http.Request, next http.Handler) {
	body, ok := m.readBody(w, r)
	if !ok {
		return
	}
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
	err = m.run(rec, r, next, tx, body)
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
