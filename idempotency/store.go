package idempotency

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
)

// A key's response is pgdedup's stored result (pgdedup.Store.ProcessResult),
// in the format of stored.go, and the request's fingerprint is pgdedup's
// (pgdedup.WithFingerprint): a reused key with another request is a
// pgdedup.ErrPayloadMismatch. A key is a duplicate until its row is deleted
// (by the cleaner), past its expires_at or not: its answer replays. The
// one statement of its own the middleware sends is in this file: it reads
// answers that versions before stored results kept in the columns of
// migration 00002, while such rows last (one Retention after the upgrade).

// legacyLookup reads the answer an earlier version stored in the columns of
// migration 00002; the headers and the body only while the key has not
// expired, so that an expired answer never leaves the table. It names
// message_id besides the key, which costs nothing (the key finds the row) and
// lets Citus route it to one shard whichever of the two the table is
// distributed by (docs/citus.md). $1 key (pgdedup.Key), $2 id.
func legacyLookup(table string) string {
	return `SELECT request_fingerprint, response_status, expires_at <= now(),` +
		` CASE WHEN expires_at > now() THEN response_headers END,` +
		` CASE WHEN expires_at > now() THEN response_body END` +
		` FROM ` + table + ` WHERE key = $1::uuid AND message_id = $2`
}

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
// returned result: decoded, or when result is nil, read from the columns of
// an earlier version. found is false if the key has no row (any more); a row
// without an answer (a message ID that another use of the Consumer name
// recorded) has status 0. An answer read from the columns of an earlier
// version may be expired, or have another fingerprint: the caller checks.
func (m *Middleware) replayed(ctx context.Context, id string, fp, result []byte) (resp *response, found bool, err error) {
	if result == nil {
		return m.legacyLoad(ctx, id)
	}
	if resp, err = decodeStored(result); err != nil {
		return nil, false, err
	}
	resp.fingerprint = fp // pgdedup compared it with the stored one
	if err := m.open(id, resp); err != nil {
		return nil, false, err
	}
	return resp, true, nil
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

// legacyLoad reads the answer an earlier version stored for id; found is
// false if there is no row. An expired row is found, with expired set and no
// headers or body.
func (m *Middleware) legacyLoad(ctx context.Context, id string) (resp *response, found bool, err error) {
	var status *int
	var body []byte
	key := pgdedup.Key(m.store.Consumer(), id)
	resp = &response{}
	err = m.db.QueryRow(ctx, m.legacySQL, key, id).Scan(&resp.fingerprint, &status, &resp.expired, &resp.header, &body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("idempotency: read an answer stored by an earlier version "+
			"(the columns of migration 00002; the middleware's role needs SELECT on them while such rows last): %w", err)
	}
	if status != nil {
		resp.status = *status
	}
	resp.body, resp.omitted = body, body == nil
	if body == nil {
		resp.body = []byte{}
	}
	if !resp.expired && resp.status != 0 {
		if err := m.open(id, resp); err != nil {
			return nil, false, err
		}
	}
	return resp, true, nil
}
