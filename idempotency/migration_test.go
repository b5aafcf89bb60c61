package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// TestUpgradeFromVersion1KeepsRows migrates a populated 00001 table to the
// latest version: existing message IDs survive unchanged and still dedupe, and
// the middleware works on the upgraded table.
func TestUpgradeFromVersion1KeepsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewUnmigrated(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	p, err := pgdedup.NewMigrationProvider(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 1); err != nil {
		t.Fatal(err)
	}
	const rows = 5000
	if _, err := db.Pool.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, processed_at, expires_at)
SELECT 'billing', 'm-' || i, '2026-01-01'::timestamptz + i * interval '1 second', '2030-01-01'::timestamptz + i * interval '1 second'
FROM generate_series(1, $1) AS i`, rows); err != nil {
		t.Fatal(err)
	}
	before := tableDigest(t, db.Pool)

	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	if v, err := p.GetDBVersion(ctx); err != nil || v < 2 {
		t.Fatalf("version after upgrade: %d, %v", v, err)
	}
	if after := tableDigest(t, db.Pool); after != before {
		t.Fatalf("old rows changed by the upgrade:\nbefore %s\nafter  %s", before, after)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages WHERE fingerprint IS NULL AND result IS NULL`); n != rows {
		t.Fatalf("%d of %d old rows have no fingerprint and no result", n, rows)
	}
	if n := legacyColumns(t, db.Pool); n != 0 {
		t.Fatalf("%d columns of migration 00002 left after the upgrade (00007 drops them)", n)
	}

	// Old IDs are still duplicates; new ones are processed.
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{"m-1": false, "m-5000": false, "m-5001": true} {
		got, err := store.Process(ctx, id, func(context.Context, pgx.Tx) error { return nil })
		if err != nil || got != want {
			t.Errorf("Process(%s) after upgrade = %v, %v; want %v", id, got, err, want)
		}
	}
	// The middleware works on the upgraded table; an old message ID under the
	// same consumer name is not a key this middleware stored: 422, not a replay.
	mw, err := idempotency.New(db.Pool, idempotency.Config{Store: pgdedup.Config{Consumer: "billing"}, GlobalScope: true, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	if r := serve(t, mw, "m-1"); r.Code != 422 {
		t.Fatalf("key equal to an old message ID: %d %s", r.Code, r.Body)
	}
	if r := serve(t, mw, "fresh"); r.Code != 200 {
		t.Fatalf("new key: %d %s", r.Code, r.Body)
	}
	if r := serve(t, mw, "fresh"); r.Code != 200 || r.Header().Get(idempotency.ReplayedHeader) != "true" {
		t.Fatalf("new key again: %d %v %s", r.Code, r.Header(), r.Body)
	}

	// And back down. 00007's Down adds the columns of 00002 back, 00002's
	// drops them again, and the rows stay.
	if _, err := p.DownTo(ctx, 1); err != nil {
		t.Fatalf("down to 1: %v", err)
	}
	if n := legacyColumns(t, db.Pool); n != 0 {
		t.Fatalf("%d columns of migration 00002 left after down", n)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages`); n != rows+2 {
		t.Fatalf("%d rows after down, want %d", n, rows+2)
	}
}

// tableDigest summarises every column of every row of the 00001 columns.
func tableDigest(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) string {
	t.Helper()
	var s string
	err := q.QueryRow(context.Background(), `SELECT count(*) || ' ' || md5(string_agg(
consumer || '|' || message_id || '|' || processed_at || '|' || expires_at, ',' ORDER BY consumer, message_id))
FROM processed_messages`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// serve runs one POST with key through mw in process, with a handler that
// answers "ok" from its transaction.
func serve(t *testing.T, mw *idempotency.Middleware, key string) *httptest.ResponseRecorder {
	t.Helper()
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var s string
		if err := idempotency.Tx(r.Context()).QueryRow(r.Context(), `SELECT 'ok'`).Scan(&s); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		fmt.Fprint(w, s)
	}))
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// legacyColumns counts the columns of migration 00002 on processed_messages.
func legacyColumns(t *testing.T, db pgtest.Querier) int {
	t.Helper()
	return pgtest.Count(t, db, `SELECT count(*) FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = 'processed_messages'
  AND column_name IN ('request_fingerprint', 'response_status', 'response_headers', 'response_body')`)
}

// toLegacy rewrites the row of key as versions before migration 00006 wrote
// it. The fingerprint is in request_fingerprint, and the status, headers
// (JSON) and body are in the columns of migration 00002. There is no result.
func toLegacy(t *testing.T, b *bundle, key string) {
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
	if _, err := b.pool.Exec(ctx, `UPDATE processed_messages SET request_fingerprint = fingerprint, response_status = $2,
response_headers = $3::jsonb, response_body = $4, fingerprint = NULL, result = NULL WHERE message_id LIKE '% ' || $1`,
		key, status, string(headers), body); err != nil {
		t.Fatal(err)
	}
}

// This release may run before migration 00007, while the columns of 00002
// are still there. It stores and replays answers as on the latest schema,
// and never reads those columns, so its role needs no grant on them. A key
// whose answer is only in them (stored by a release before 00006) is not
// run again. It gets 422 #key-reused, as a row without an answer does. Once
// that answer has expired, 00007 runs, and the answers stored before it
// still replay.
func TestMiddlewareAcrossMigration00007(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	ctx := context.Background()
	sqlDB := stdlib.OpenDBFromPool(b.pool)
	defer sqlDB.Close()
	p, err := pgdedup.NewMigrationProvider(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 6); err != nil {
		t.Fatal(err)
	}
	if n := legacyColumns(t, b.pool); n != 4 {
		t.Fatalf("%d columns of migration 00002 at version 6, want 4", n)
	}
	web := grantedPool(t, b.db, httpGrants)
	w := setupOn(t, b.db, web, idempotency.Config{}, b.api)

	first := post(t, w.url, "k", order)
	if first.status != 201 {
		t.Fatalf("first request at version 6: %v", first)
	}
	replay := func(t *testing.T, url string) {
		t.Helper()
		if r := post(t, url, "k", order); r.status != 201 || r.body != first.body || !r.replayed() ||
			r.header.Get("Location") != first.header.Get("Location") {
			t.Fatalf("replay: %v\nfirst: %v", r, first)
		}
	}
	replay(t, w.url)
	post(t, w.url, "old", order)
	toLegacy(t, b, "old")
	if r := post(t, w.url, "old", order); !isProblem(r, 422) || !strings.Contains(r.body, "#key-reused") || r.replayed() {
		t.Fatalf("a key answered in the columns of 00002: %v", r)
	}
	if n := b.api.calls.Load(); n != 2 {
		t.Fatalf("handler called %d times, want 2", n)
	}

	// 00007 refuses while that answer is live, and runs once it expired.
	if _, err := p.Up(ctx); err == nil || !strings.Contains(err.Error(), "1 unexpired answers in the columns of migration 00002") {
		t.Fatalf("00007 with a live answer in the columns of 00002: %v", err)
	}
	pgtest.Exec(t, b.pool, `UPDATE processed_messages SET expires_at = now() - interval '1 second' WHERE response_status IS NOT NULL`)
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("00007: %v", err)
	}
	if n := legacyColumns(t, b.pool); n != 0 {
		t.Fatalf("%d columns of migration 00002 after 00007", n)
	}
	replay(t, w.url)
	replay(t, b.url)
	if r := post(t, w.url, "old", order); !isProblem(r, 422) || !strings.Contains(r.body, "#key-reused") {
		t.Fatalf("the key answered in the columns of 00002, after 00007: %v", r)
	}
	if r := post(t, w.url, "new", order); r.status != 201 || r.replayed() {
		t.Fatalf("a new key after 00007: %v", r)
	}
	if n := b.api.calls.Load(); n != 3 {
		t.Fatalf("handler called %d times, want 3", n)
	}
}
