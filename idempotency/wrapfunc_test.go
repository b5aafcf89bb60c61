package idempotency_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/pgdedup/pgdedup/idempotency"
)

// errSerialization makes the handler of TestWrapFuncErrorRollsBack fail its
// transaction with a serialization failure and return the server's error.
var errSerialization = errors.New("raise 40001 in the transaction")

// TestWrapFuncErrorRollsBack: a handler error undoes its writes and leaves the
// key free; a transient error re-runs the handler in a new transaction.
func TestWrapFuncErrorRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	var calls atomic.Int32
	failWith := make(chan error, 1) // the next call returns this after its insert
	srv := httptest.NewServer(authenticate(b.mw.WrapFunc(func(w http.ResponseWriter, r *http.Request) error {
		calls.Add(1)
		if _, err := idempotency.Tx(r.Context()).Exec(r.Context(), `INSERT INTO charges (order_id, amount) VALUES ('o', 1)`); err != nil {
			return err
		}
		select {
		case err := <-failWith:
			fmt.Fprint(w, "half-written answer") // discarded
			if err == errSerialization {
				_, err = idempotency.Tx(r.Context()).Exec(r.Context(), `DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END $$`)
			}
			return err
		default:
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	})))
	t.Cleanup(srv.Close)

	failWith <- errors.New("payment provider said no")
	if r := post(t, srv.URL, "k", order); !isProblem(r, 500) || charges(t, b.pool) != 0 || keys(t, b.pool) != 0 {
		t.Fatalf("handler error: %v; %d charges, %d keys", r, charges(t, b.pool), keys(t, b.pool))
	}
	failWith <- errSerialization // the transaction's serialization failure: retried at once
	if r := post(t, srv.URL, "k", order); r.status != 201 || r.replayed() {
		t.Fatalf("after a transient error: %v", r)
	}
	if r := post(t, srv.URL, "k", order); r.status != 201 || !r.replayed() {
		t.Fatalf("replay: %v", r)
	}
	if calls.Load() != 3 || charges(t, b.pool) != 1 {
		t.Fatalf("%d calls, %d charges; want 3 (fail, transient, success), 1", calls.Load(), charges(t, b.pool))
	}
}
