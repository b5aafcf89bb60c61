package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
)

// Every statement the middleware sends about stored responses is in this file;
// the claim itself is pgdedup.Store.Process's.

// statements are the middleware's SQL on the Store's table. Both name
// message_id besides the key, which costs nothing (the key finds the row) and
// lets Citus route them to one shard whichever of the two the table is
// distributed by (docs/citus.md).
type statements struct {
	// lookup reads a key's stored response; the headers and the body only
	// while the key has not expired, so an expired answer never leaves the
	// table even when the cleaner is late. $1 key (pgdedup.Key), $2 id.
	lookup string
	// save stores a response in the claim's transaction. $1 key, $2
	// fingerprint, $3 status, $4 headers, $5 body, $6 id.
	save string
}

func newStatements(table string) statements {
	return statements{
		lookup: `SELECT request_fingerprint, response_status, expires_at <= now(),` +
			` CASE WHEN expires_at > now() THEN response_headers END,` +
			` CASE WHEN expires_at > now() THEN response_body END` +
			` FROM ` + table + ` WHERE key = $1::uuid AND message_id = $2`,
		save: `UPDATE ` + table + ` SET request_fingerprint = $2, response_status = $3, response_headers = $4, response_body = $5` +
			` WHERE key = $1::uuid AND message_id = $6`,
	}
}

// save stores resp as the answer of id, in tx, the transaction that claimed id.
func (m *Middleware) save(ctx context.Context, tx pgx.Tx, id string, fp []byte, resp *response) error {
	key := pgdedup.Key(m.store.Consumer(), id)
	stored := resp.forStorage(m.cfg.ReplayHeaders, m.cfg.MaxStoredBody)
	if m.cfg.StoredBody != nil && stored.body != nil {
		sealed, err := m.cfg.StoredBody.Seal(key, stored.status, stored.body)
		if err != nil {
			return fmt.Errorf("idempotency: StoredBody.Seal: %w", err)
		}
		stored.body, stored.sealed = sealed, true
		if sealed == nil {
			stored.body, stored.sealed, stored.omitted = []byte{}, false, true
		}
	}
	// The headers go as JSON text, not as an http.Header: pgx's exec and
	// simple_protocol modes (the ones for PgBouncer) infer parameter types
	// from Go types and cannot encode a map as jsonb.
	headers, err := json.Marshal(stored.header)
	if err != nil {
		return fmt.Errorf("idempotency: store response: %w", err)
	}
	body := stored.body
	if stored.omitted {
		body = nil // stored as NULL
	}
	if _, err := tx.Exec(ctx, m.sql.save, key, fp, stored.status, string(headers), body, id); err != nil {
		return fmt.Errorf("idempotency: store response: %w", err)
	}
	stored.fingerprint = fp
	resp.stored = stored
	return nil
}

// keepAnswer claims id and stores resp as its answer in a transaction of its
// own, for an answer whose handler's writes were rolled back
// (ReplayClientErrors). kept is false when another request claimed id first.
func (m *Middleware) keepAnswer(ctx context.Context, id string, fp []byte, resp *response) (kept bool, err error) {
	return m.store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
		return m.save(ctx, tx, id, fp, resp)
	})
}

// errStoredBody is an answer whose stored body StoredBody.Open refused.
var errStoredBody = errors.New("idempotency: StoredBody.Open")

// load reads the stored response of id; found is false if there is no row.
// An expired row is found, with expired set and no headers or body.
func (m *Middleware) load(ctx context.Context, id string) (resp *response, found bool, err error) {
	var status *int
	var body []byte
	key := pgdedup.Key(m.store.Consumer(), id)
	resp = &response{}
	err = m.db.QueryRow(ctx, m.sql.lookup, key, id).Scan(&resp.fingerprint, &status, &resp.expired, &resp.header, &body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("idempotency: load response: %w", err)
	}
	if status != nil {
		resp.status = *status
	}
	if m.cfg.StoredBody != nil && body != nil && !resp.expired {
		if body, err = m.cfg.StoredBody.Open(key, resp.status, body); err != nil {
			return nil, false, fmt.Errorf("%w: %w", errStoredBody, err)
		}
	}
	resp.body, resp.omitted = body, body == nil
	if body == nil {
		resp.body = []byte{}
	}
	return resp, true, nil
}
