package idempotency

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
)

// A key's response is pgdedup's stored result (pgdedup.Store.ProcessResult),
// in the format of stored.go. The request's fingerprint is pgdedup's
// (pgdedup.WithFingerprint), so a reused key with another request is a
// pgdedup.ErrPayloadMismatch. A key is a duplicate until the cleaner deletes
// its row, past its expires_at or not, and its answer replays.

// claimOptions are the options of every claim of a key with fingerprint fp.
func (m *Middleware) claimOptions(fp []byte) []pgdedup.Option {
	return []pgdedup.Option{pgdedup.WithFingerprint(fp), pgdedup.WithMaxResultBytes(m.cfg.MaxStoredBody + storedOverhead)}
}

// encode returns the stored form of resp, the answer of id to a request with
// fingerprint fp, and remembers it as resp.stored for the requests waiting
// on the same key.
func (m *Middleware) encode(id string, fp []byte, resp *response) ([]byte, error) {
	stored := resp.forStorage(m.cfg.ReplayHeaders, m.cfg.MaxStoredBody)
	if m.cfg.StoredBody != nil && !stored.omitted {
		sealed, err := m.cfg.StoredBody.Seal(pgdedup.Key(m.store.Consumer(), id), stored.status, stored.body)
		if err != nil {
			return nil, fmt.Errorf("idempotency: StoredBody.Seal: %w", err)
		}
		stored.body, stored.sealed = sealed, true
		if sealed == nil {
			stored.body, stored.sealed, stored.omitted = []byte{}, false, true
		}
	}
	stored.fingerprint = fp
	resp.stored = stored
	return encodeStored(stored), nil
}

// keepAnswer claims id and stores resp as its answer in a transaction of its
// own, for an answer whose handler's writes were rolled back
// (ReplayClientErrors). kept is false when another request claimed id first.
func (m *Middleware) keepAnswer(ctx context.Context, id string, fp []byte, resp *response) (kept bool, err error) {
	_, kept, err = m.store.ProcessResult(ctx, id, func(context.Context, pgx.Tx) ([]byte, error) {
		return m.encode(id, fp, resp)
	}, m.claimOptions(fp)...)
	return kept, err
}

// errStoredBody is an answer whose stored body StoredBody.Open refused.
var errStoredBody = errors.New("idempotency: StoredBody.Open")

// replayed returns the answer to replay for a duplicate of id whose claim
// returned result. A row without a result has status 0. Such a row is a
// message ID that another use of the Consumer name recorded. It may also be
// an answer that a version before migration 00006 kept in the columns of
// migration 00002, which are no longer read (migration 00007 drops them).
func (m *Middleware) replayed(id string, fp, result []byte) (*response, error) {
	if result == nil {
		return &response{}, nil
	}
	resp, err := decodeStored(result)
	if err != nil {
		return nil, err
	}
	resp.fingerprint = fp // pgdedup compared it with the stored one
	if err := m.open(id, resp); err != nil {
		return nil, err
	}
	return resp, nil
}

// open replaces a stored body with what StoredBody.Open makes of it.
func (m *Middleware) open(id string, resp *response) error {
	if m.cfg.StoredBody == nil || resp.omitted {
		return nil
	}
	body, err := m.cfg.StoredBody.Open(pgdedup.Key(m.store.Consumer(), id), resp.status, resp.body)
	if err != nil {
		return fmt.Errorf("%w: %w", errStoredBody, err)
	}
	resp.body, resp.sealed = body, false
	return nil
}
