package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
)

// errHandlerFailed rolls back a request whose handler answered 5xx.
var errHandlerFailed = errors.New("idempotency: handler answered 5xx")

// Wrap returns next made idempotent by the request's key.
//
// The first request with a key runs next in a transaction (see Tx) that also
// claims the key; if next answers below 500, its status, ReplayHeaders and body
// are stored with the key in that transaction, which commits before the
// response is sent. A 5xx answer or a panic rolls everything back, so a retry
// runs next again. A later request with the key and the same fingerprint gets
// the stored response with ReplayedHeader, without calling next; with another
// fingerprint it gets 422. The response is buffered, so next cannot stream,
// flush or hijack the connection.
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
	body, status, detail := readBody(r, m.cfg.MaxRequestBody)
	switch status {
	case 0:
	case http.StatusRequestEntityTooLarge:
		m.problem(w, status, bodyTooLarge, detail)
		return
	default:
		m.problem(w, status, otherProblem, detail)
		return
	}
	id := scopedID(m.cfg.Scope, r, key)
	if err := pgdedup.ValidateMessageID(id); err != nil { // only a bad Scope result gets here
		m.fail(w, r, fmt.Errorf("idempotency: scoped key: %w", err))
		return
	}
	fp := fingerprintSum(m.cfg.Fingerprint(r, body))

	// A key found as a duplicate can expire and be cleaned before it is looked
	// up; then it is claimed again, as a new key.
	for range 3 {
		rec, processed, err := m.process(r, next, id, fp, body)
		switch {
		case errors.Is(err, errHandlerFailed):
			rec.response().send(w, false)
			return
		case errors.Is(err, pgdedup.ErrInFlight):
			w.Header().Set("Retry-After", "1")
			m.problem(w, http.StatusConflict, keyInFlight, fmt.Sprintf("A request with this %s is still being processed. Retry it later to get its response.", m.cfg.Header))
			return
		case err != nil:
			m.fail(w, r, err)
			return
		case processed:
			rec.response().send(w, false)
			return
		}
		stored, found, err := m.load(r.Context(), id)
		switch {
		case err != nil:
			m.fail(w, r, err)
			return
		case !found:
			continue
		case !bytes.Equal(stored.fingerprint, fp) || stored.status == 0:
			m.problem(w, http.StatusUnprocessableEntity, keyReused, fmt.Sprintf("This %s was already used for a different request (another method, URL or body). Use a new key for a new request.", m.cfg.Header))
			return
		}
		stored.send(w, true)
		return
	}
	m.fail(w, r, errors.New("idempotency: key kept expiring between claim and lookup"))
}

// process claims id and, when it is new, runs next and stores its response, all
// in one transaction. pgdedup.Store.Process retries transient failures, so next
// may run more than once, each time in a fresh transaction.
func (m *Middleware) process(r *http.Request, next http.Handler, id string, fp, body []byte) (rec *recorder, processed bool, err error) {
	processed, err = m.store.Process(r.Context(), id, func(ctx context.Context, tx pgx.Tx) error {
		rec = newRecorder()
		req := withTx(r, tx)
		req.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(rec, req)
		if rec.err != nil {
			return rec.err
		}
		resp := rec.response()
		if resp.status >= 500 {
			return errHandlerFailed
		}
		stored := resp.forStorage(m.cfg.ReplayHeaders, m.cfg.MaxStoredBody)
		// The headers go as JSON text, not as an http.Header: pgx's exec and
		// simple_protocol modes (the ones for PgBouncer) infer parameter types
		// from Go types and cannot encode a map as jsonb.
		headers, err := json.Marshal(stored.header)
		if err != nil {
			return fmt.Errorf("idempotency: store response: %w", err)
		}
		_, err = tx.Exec(ctx, m.respond, pgdedup.Key(m.store.Consumer(), id), fp, stored.status, string(headers), stored.body, id)
		if err != nil {
			return fmt.Errorf("idempotency: store response: %w", err)
		}
		return nil
	})
	return rec, processed, err
}

// serveWithoutKey runs next in a plain transaction, for Config.Optional.
func (m *Middleware) serveWithoutKey(w http.ResponseWriter, r *http.Request, next http.Handler) {
	ctx := r.Context()
	tx, err := m.db.BeginTx(ctx, m.cfg.Store.TxOptions)
	if err != nil {
		m.fail(w, r, fmt.Errorf("idempotency: begin: %w", err))
		return
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	rec := newRecorder()
	next.ServeHTTP(rec, withTx(r, tx))
	if rec.err != nil {
		m.fail(w, r, rec.err)
		return
	}
	resp := rec.response()
	if resp.status < 500 {
		if err := tx.Commit(ctx); err != nil {
			m.fail(w, r, fmt.Errorf("idempotency: commit: %w", err))
			return
		}
	}
	resp.send(w, false)
}

// load reads the stored response of id; found is false if there is no row.
func (m *Middleware) load(ctx context.Context, id string) (resp *response, found bool, err error) {
	var status *int
	var body []byte
	resp = &response{}
	err = m.db.QueryRow(ctx, m.lookup, pgdedup.Key(m.store.Consumer(), id), id).Scan(&resp.fingerprint, &status, &resp.header, &body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("idempotency: load response: %w", err)
	}
	if status != nil {
		resp.status = *status
	}
	resp.body, resp.omitted = body, body == nil
	return resp, true, nil
}

// fail answers a request that could not be completed because of the database
// (or a bad Scope). Nothing was committed unless a commit's outcome is unknown,
// and either way a retry with the same key is safe.
func (m *Middleware) fail(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client is gone
	}
	m.log.WarnContext(r.Context(), "idempotency: request failed", "consumer", m.store.Consumer(), "error", err)
	status := http.StatusInternalServerError
	if pgdedup.IsTransient(err) {
		status = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
	}
	m.problem(w, status, otherProblem, fmt.Sprintf("The request could not be completed. Retrying it with the same %s is safe.", m.cfg.Header))
}
