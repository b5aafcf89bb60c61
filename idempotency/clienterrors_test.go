package idempotency_test

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// debitAPI writes a debit row, then answers 402 when the amount is over 100,
// the status in X-Status when one is asked for, and 201 otherwise.
type debitAPI struct{ calls atomic.Int32 }

func (a *debitAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := a.calls.Add(1)
	tx := idempotency.Tx(r.Context())
	if _, err := tx.Exec(r.Context(), `INSERT INTO charges (order_id, amount) VALUES ('debit', 1)`); err != nil {
		http.Error(w, err.Error(), 500)
		return
	}
	var status int
	if _, err := fmt.Sscan(r.Header.Get("X-Status"), &status); err == nil {
		http.Error(w, "refused", status)
		return
	}
	if strings.Contains(r.URL.RawQuery, "amount=500") {
		http.Error(w, fmt.Sprintf("insufficient funds (call %d)", n), http.StatusPaymentRequired)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

func debitServer(t *testing.T, cfg idempotency.Config) (*bundle, *debitAPI) {
	t.Helper()
	b := setup(t, cfg, nil)
	api := &debitAPI{}
	srv := httptest.NewServer(authenticate(b.mw.Wrap(api)))
	t.Cleanup(srv.Close)
	b.url = srv.URL
	return b, api
}

// A handler that writes a debit and then answers 402: by default the debit
// rolls back and the 402 is kept for replay; ForgetClientErrors keeps
// nothing, so a retry runs the handler again; CommitClientErrors commits the
// debit with the answer.
func TestClientErrorPolicies(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		policy              idempotency.ClientErrorPolicy
		debits, calls, keys int
		replayed            bool
	}{
		{idempotency.ReplayClientErrors, 0, 1, 1, true},
		{idempotency.ForgetClientErrors, 0, 2, 0, false},
		{idempotency.CommitClientErrors, 1, 1, 1, true},
	} {
		t.Run(c.policy.String(), func(t *testing.T) {
			t.Parallel()
			b, api := debitServer(t, idempotency.Config{ClientErrors: c.policy})
			first := post(t, b.url+"?amount=500", "k", "{}")
			if first.status != 402 || first.replayed() || charges(t, b.pool) != c.debits {
				t.Fatalf("first: %v; %d debits, want %d", first, charges(t, b.pool), c.debits)
			}
			again := post(t, b.url+"?amount=500", "k", "{}")
			if again.status != 402 || again.replayed() != c.replayed || c.replayed && again.body != first.body {
				t.Fatalf("retry: %v\nfirst: %v", again, first)
			}
			if int(api.calls.Load()) != c.calls || keys(t, b.pool) != c.keys || charges(t, b.pool) != c.debits {
				t.Fatalf("%d calls, %d keys, %d debits; want %d, %d, %d", api.calls.Load(), keys(t, b.pool), charges(t, b.pool), c.calls, c.keys, c.debits)
			}
			// A success commits and is kept under every policy.
			if r := post(t, b.url+"?amount=5", "k-ok", "{}"); r.status != 201 || charges(t, b.pool) != c.debits+1 {
				t.Fatalf("success: %v, %d debits", r, charges(t, b.pool))
			}
		})
	}
}

// 401, 403 and 429 are answers about the caller, not the operation: never
// kept by default (and their writes roll back), so a retry after signing in
// again or waiting is processed. NotKept changes the list.
func TestNotKeptStatuses(t *testing.T) {
	t.Parallel()
	b, api := debitServer(t, idempotency.Config{ClientErrors: idempotency.CommitClientErrors})
	for i, status := range []string{"401", "403", "429"} {
		key := "k" + status
		for range 2 {
			if r := post(t, b.url, key, "{}", "X-Status", status); r.status != atoi(status) || r.replayed() {
				t.Fatalf("%s: %v", status, r)
			}
		}
		if r := post(t, b.url, key, "{}"); r.status != 201 || r.replayed() {
			t.Fatalf("after %s, the key is free: %v", status, r)
		}
		if int(api.calls.Load()) != 3*(i+1) || charges(t, b.pool) != i+1 {
			t.Fatalf("%s: %d calls, %d debits", status, api.calls.Load(), charges(t, b.pool))
		}
	}

	k, api := debitServer(t, idempotency.Config{NotKept: []int{}})
	first := post(t, k.url, "k", "{}", "X-Status", "429")
	if r := post(t, k.url, "k", "{}", "X-Status", "429"); r.status != 429 || !r.replayed() || r.body != first.body || api.calls.Load() != 1 {
		t.Fatalf("NotKept empty: 429 again: %v", r)
	}
}

func atoi(s string) int {
	var n int
	_, _ = fmt.Sscan(s, &n)
	return n
}

// A statement that fails in the handler aborts the transaction. A handler
// that then answers 4xx (a unique violation answered 409) gets its answer
// sent and, by default, kept: the retry replays it, instead of a permanent
// 500 that promised a safe retry. A handler that answers 201 anyway gets an
// honest 500 that promises nothing, and the cause is logged.
func TestStatementFailureInHandler(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	b := setup(t, idempotency.Config{Store: pgdedup.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}}, nil)
	pgtest.Exec(t, b.pool, `CREATE TABLE orders (id text PRIMARY KEY)`)
	pgtest.Exec(t, b.pool, `INSERT INTO orders VALUES ('taken')`)
	var calls atomic.Int32
	srv := httptest.NewServer(authenticate(b.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, err := idempotency.Tx(r.Context()).Exec(r.Context(), `INSERT INTO orders VALUES ('taken')`)
		var pgErr *pgconn.PgError
		switch {
		case r.URL.Query().Has("ignore-error"):
			w.WriteHeader(http.StatusCreated)
		case r.URL.Query().Has("answer-500"):
			http.Error(w, "database error", http.StatusInternalServerError)
		case errors.As(err, &pgErr) && pgErr.Code == "23505":
			http.Error(w, "order exists", http.StatusConflict)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	}))))
	t.Cleanup(srv.Close)

	first := post(t, srv.URL, "k", "{}")
	if first.status != 409 || first.replayed() || !strings.Contains(first.body, "order exists") {
		t.Fatalf("handler's 409: %v", first)
	}
	if r := post(t, srv.URL, "k", "{}"); r.status != 409 || !r.replayed() || r.body != first.body || calls.Load() != 1 {
		t.Fatalf("retry: %v, %d calls", r, calls.Load())
	}

	for range 2 { // a 5xx after a failed statement is not kept either
		if r := post(t, srv.URL+"?answer-500", "k5", "{}"); r.status != 500 || r.replayed() || keys(t, b.pool) != 1 {
			t.Fatalf("500 after a failed statement: %v, %d keys", r, keys(t, b.pool))
		}
	}

	r := post(t, srv.URL+"?ignore-error", "k2", "{}")
	if !isProblem(r, 500) || strings.Contains(r.body, "safe") || strings.Contains(r.body, "Retry") {
		t.Fatalf("201 after a failed statement: %v", r)
	}
	if keys(t, b.pool) != 1 || !strings.Contains(logs.String(), "a statement failed in idempotency.Tx, and the handler then answered 201") {
		t.Fatalf("%d keys; logs:\n%s", keys(t, b.pool), logs.String())
	}
}

// A handler that commits or rolls back Tx itself is refused and named: its
// Commit returns ErrTxManaged, nothing commits, the client gets 500 (not a
// later "used for a different request"), and the log says what happened.
// COMMIT sent as SQL is caught too.
func TestHandlerEndingTxIsNamed(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	b := setup(t, idempotency.Config{Store: pgdedup.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}}, nil)
	var commitErr atomic.Value
	srv := httptest.NewServer(authenticate(b.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, tx := r.Context(), idempotency.Tx(r.Context())
		if _, err := tx.Exec(ctx, `INSERT INTO charges (order_id, amount) VALUES ('o', 1)`); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		switch r.URL.RawQuery {
		case "commit":
			commitErr.Store(tx.Commit(ctx))
		case "rollback":
			defer tx.Rollback(ctx) //nolint:errcheck // the habit this catches
		case "sql":
			_, _ = tx.Exec(ctx, `COMMIT`)
		}
		w.WriteHeader(http.StatusCreated)
	}))))
	t.Cleanup(srv.Close)

	for _, how := range []string{"commit", "rollback"} {
		if r := post(t, srv.URL+"?"+how, "k-"+how, "{}"); !isProblem(r, 500) {
			t.Fatalf("%s: %v", how, r)
		}
	}
	if err, _ := commitErr.Load().(error); !errors.Is(err, idempotency.ErrTxManaged) {
		t.Fatalf("tx.Commit returned %v, want ErrTxManaged", err)
	}
	if charges(t, b.pool) != 0 || keys(t, b.pool) != 0 {
		t.Fatalf("%d charges, %d keys; want 0, 0", charges(t, b.pool), keys(t, b.pool))
	}
	if n := strings.Count(logs.String(), "must not commit or roll back idempotency.Tx"); n != 2 {
		t.Fatalf("the misuse is named %d times, want 2:\n%s", n, logs.String())
	}
	if r := post(t, srv.URL+"?sql", "k-sql", "{}"); !isProblem(r, 500) || !strings.Contains(logs.String(), "COMMIT or ROLLBACK statement") {
		t.Fatalf("COMMIT as SQL: %v\n%s", r, logs.String())
	}
	// Without the misuse the same handler works.
	if r := post(t, srv.URL, "k-ok", "{}"); r.status != 201 {
		t.Fatal(r)
	}
}
