package idempotency_test

import (
	"context"
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
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages
WHERE request_fingerprint IS NULL AND response_status IS NULL AND response_headers IS NULL AND response_body IS NULL`); n != rows {
		t.Fatalf("%d of %d old rows have NULL response columns", n, rows)
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

	// And back down: the columns go, the rows stay.
	if _, err := p.DownTo(ctx, 1); err != nil {
		t.Fatalf("down to 1: %v", err)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = 'processed_messages' AND column_name LIKE 'response%'`); n != 0 {
		t.Fatalf("%d response columns left after down", n)
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
