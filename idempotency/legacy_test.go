package idempotency_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// toLegacy rewrites the row of key as versions before stored results wrote
// it: the fingerprint in request_fingerprint, the status, headers (JSON) and
// body (NULL when omitted) in the columns of migration 00002, and no result.
func toLegacy(t *testing.T, b *bundle, key string, omitBody bool) {
	t.Helper()
	ctx := context.Background()
	var result []byte
	if err := b.pool.QueryRow(ctx, `SELECT result FROM processed_messages WHERE message_id LIKE '% ' || $1`, key).Scan(&result); err != nil {
		t.Fatal(err)
	}
	status, header, body, _, err := idempotency.DecodeStored(result)
	if err != nil {
		t.Fatal(err)
	}
	headers, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	if omitBody {
		body = nil
	}
	if _, err := b.pool.Exec(ctx, `UPDATE processed_messages SET request_fingerprint = fingerprint, response_status = $2,
response_headers = $3::jsonb, response_body = $4, fingerprint = NULL, result = NULL WHERE message_id LIKE '% ' || $1`,
		key, status, string(headers), body); err != nil {
		t.Fatal(err)
	}
}

// During an upgrade, answers that earlier versions stored in the columns of
// migration 00002 (result NULL) are still replayed, refused with another
// request (422) and when expired (422), and an omitted body stays omitted.
// The middleware's role reads those columns only with the upgrade's grants,
// and without them fails with an error that says so.
func TestAnswersOfEarlierVersionsReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	ctx := context.Background()
	first := post(t, b.url, "k", order)
	omitted := post(t, b.url, "k-omit", order)
	post(t, b.url, "k-expired", order)
	for key, omit := range map[string]bool{"k": false, "k-omit": true, "k-expired": false} {
		toLegacy(t, b, key, omit)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE processed_messages SET expires_at = now() - interval '1 second' WHERE message_id LIKE '% k-expired'`); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE result IS NULL AND fingerprint IS NULL AND response_status = 201`); n != 3 {
		t.Fatalf("%d rows in the earlier format, want 3", n)
	}

	replayOK := func(t *testing.T, url string) {
		t.Helper()
		if r := post(t, url, "k", order); r.status != 201 || r.body != first.body || !r.replayed() ||
			r.header.Get("Location") != first.header.Get("Location") || r.header.Get("Content-Type") != "application/json" {
			t.Fatalf("replay of an earlier version's answer: %v\nfirst: %v", r, first)
		}
	}
	replayOK(t, b.url)
	if r := post(t, b.url, "k", `{"order":"o-2","amount":1}`); !isProblem(r, 422) || !strings.Contains(r.body, "#key-reused") {
		t.Fatalf("another request with an earlier version's key: %v", r)
	}
	if r := post(t, b.url, "k-omit", order); r.status != 201 || r.body != "" || !r.replayed() ||
		r.header.Get(idempotency.BodyOmittedHeader) != "true" || r.header.Get("Location") != omitted.header.Get("Location") {
		t.Fatalf("replay of an omitted body: %v", r)
	}
	if r := post(t, b.url, "k-expired", order); !isProblem(r, 422) || !strings.Contains(r.body, "#key-expired") {
		t.Fatalf("an earlier version's expired key: %v", r)
	}
	if n := b.api.calls.Load(); n != 3 {
		t.Fatalf("handler called %d times, want 3", n)
	}

	// The middleware's role: with httpGrants alone, a clear error; with the
	// upgrade's grants, the replay.
	var logs syncBuffer
	web := grantedPool(t, b.db, httpGrants)
	w := setupOn(t, b.db, web, idempotency.Config{Store: pgdedup.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}}, b.api)
	if r := post(t, w.url, "k", order); !isProblem(r, 500) || r.replayed() || !strings.Contains(logs.String(), "migration 00002") {
		t.Fatalf("without the upgrade's grants: %v\nlogs: %s", r, logs.String())
	}
	upgraded := grantedPool(t, b.db, append(httpGrants, httpUpgradeGrants...))
	replayOK(t, setupOn(t, b.db, upgraded, idempotency.Config{}, b.api).url)
	if n := b.api.calls.Load(); n != 3 {
		t.Fatalf("handler called %d times, want 3", n)
	}
}
