package pgdedup_test

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
	"github.com/pgdedup/pgdedup/internal/wireproxy"
)

// raise makes fn fail with the given SQLSTATE on its first calls.
func raise(code string, failures int, calls *int) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		*calls++
		if err := charge("order-1")(ctx, tx); err != nil {
			return err
		}
		if *calls <= failures {
			_, err := tx.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '%s'; END $$`, code))
			return err
		}
		return nil
	}
}

func TestProcessRetriesTransientFailures(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"40001", "40P01"} {
		t.Run(code, func(t *testing.T) {
			t.Parallel()
			var retries atomic.Int64
			b := setup(t, pgdedup.Config{OnEvent: func(_ context.Context, e pgdedup.Event) {
				if e.Kind == pgdedup.EventRetry {
					retries.Add(1)
				}
			}})
			ctx := ctxT(t)
			calls := 0
			processed, err := b.store.Process(ctx, "msg-1", raise(code, 2, &calls))
			if err != nil || !processed || calls != 3 {
				t.Fatalf("processed=%v err=%v calls=%d, want true, nil, 3", processed, err, calls)
			}
			if got := chargesPerOrder(t, b.pool)["order-1"]; got != 1 {
				t.Fatalf("order-1 charged %d times, want 1", got)
			}
			if retries.Load() != 2 {
				t.Fatalf("%d retry events, want 2", retries.Load())
			}
		})
	}
}

func TestProcessGivesUpAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{MaxAttempts: 2})
	ctx := ctxT(t)
	calls := 0
	_, err := b.store.Process(ctx, "msg-1", raise("40001", 100, &calls))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" || calls != 2 {
		t.Fatalf("err=%v calls=%d, want the 40001 error after 2 attempts", err, calls)
	}
	if recorded(t, b.pool, "billing", "msg-1") || len(chargesPerOrder(t, b.pool)) != 0 {
		t.Fatal("failed attempts left data behind")
	}
}

func TestProcessDoesNotRetryPermanentErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	calls := 0
	_, err := b.store.Process(ctx, "msg-1", raise("23505", 100, &calls)) // unique_violation
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" || calls != 1 {
		t.Fatalf("err=%v calls=%d, want the 23505 error after 1 attempt", err, calls)
	}
}

// The backend serving fn is terminated mid-transaction: the attempt fails with
// a lost connection and the retry, on a new connection, processes the message.
func TestProcessRetriesLostConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	calls := 0
	processed, err := b.store.Process(ctx, "msg-1", func(ctx context.Context, tx pgx.Tx) error {
		calls++
		if err := charge("order-1")(ctx, tx); err != nil {
			return err
		}
		if calls == 1 {
			var pid int
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			if _, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend($1::int)`, pid); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT 1`)
			return err
		}
		return nil
	})
	if err != nil || !processed || calls != 2 {
		t.Fatalf("processed=%v err=%v calls=%d, want true, nil, 2", processed, err, calls)
	}
	if got := chargesPerOrder(t, b.pool)["order-1"]; got != 1 {
		t.Fatalf("order-1 charged %d times, want 1", got)
	}
}

// Retries stop when ctx is done, even with attempts left.
func TestProcessRetriesRespectContext(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{MaxAttempts: 1000})
	ctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	defer cancel()
	calls := 0
	_, err := b.store.Process(ctx, "msg-1", raise("40001", 1_000_000, &calls))
	if err == nil || calls >= 1000 {
		t.Fatalf("err=%v after %d calls, want a failure before the attempts run out", err, calls)
	}
	if n := acquiredConns(b.pool); n != 0 {
		t.Fatalf("%d connections still acquired", n)
	}
}

// sqlStateError is a database/sql driver's error as lib/pq and others shape
// it: a type with a SQLState method.
type sqlStateError string

func (e sqlStateError) Error() string    { return "pq: " + string(e) }
func (e sqlStateError) SQLState() string { return string(e) }

// IsTransient classifies by SQLSTATE and error type alone, wrapped or not. A
// network error or io.EOF that pgdedup did not mark as the loss of a database
// connection is not transient: it may come from anything fn called.
func TestIsTransient(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "any text"} }
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"serialization failure 40001", pg("40001"), true},
		{"deadlock 40P01", pg("40P01"), true},
		{"admin shutdown 57P01", pg("57P01"), true},
		{"crash shutdown 57P02", pg("57P02"), true},
		{"cannot connect now 57P03", pg("57P03"), true},
		{"connection failure 08006", pg("08006"), true},
		{"connection exception 08000", pg("08000"), true},
		{"wrapped 40001", fmt.Errorf("charge: %w", pg("40001")), true},
		{"database/sql driver 40001", fmt.Errorf("exec: %w", sqlStateError("40001")), true},
		{"database/sql driver 40P01", sqlStateError("40P01"), true},
		{"database/sql driver 23505", sqlStateError("23505"), false},
		{"driver.ErrBadConn", fmt.Errorf("begin: %w", driver.ErrBadConn), true},
		{"connect error", &pgconn.ConnectError{}, true},
		{"unique violation 23505", pg("23505"), false},
		{"lock not available 55P03", pg("55P03"), false},
		{"undefined table 42P01", pg("42P01"), false},
		{"query canceled 57014", pg("57014"), false},
		{"plain error", errors.New("serialization failure"), false},
		{"context canceled", context.Canceled, false},
		{"deadline exceeded", fmt.Errorf("claim: %w", context.DeadlineExceeded), false},
		{"a decoder's io.EOF", io.EOF, false},
		{"unexpected EOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), false},
		{"connection reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, false},
		{"broken pipe", fmt.Errorf("write: %w", syscall.EPIPE), false},
		{"connection refused", syscall.ECONNREFUSED, false},
		{"invalid message ID", pgdedup.ErrInvalidMessageID, false},
		{"in flight", pgdedup.ErrInFlight, false},
	} {
		if got := pgdedup.IsTransient(c.err); got != c.want {
			t.Errorf("IsTransient(%s) = %v, want %v", c.name, got, c.want)
		}
	}
}

// A payment gateway takes the charge, then drops the connection before it
// replies. fn returns the HTTP client's error: Process returns it after one
// attempt, so the gateway charged once, and the error is not transient (the
// gateway may have acted on the request: requeueing would charge again).
func TestProcessDoesNotRetryFnNetworkErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	var charged atomic.Int64
	gateway := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charged.Add(1)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close() // the reply is lost
		}
	}))
	defer gateway.Close()
	calls := 0
	processed, err := b.store.Process(ctx, "pay-1", func(ctx context.Context, tx pgx.Tx) error {
		calls++
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, gateway.URL+"/charges", strings.NewReader(`{"amount":100}`))
		if err != nil {
			return err
		}
		resp, err := gateway.Client().Do(req)
		if err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
		resp.Body.Close()
		return charge("order-1")(ctx, tx)
	})
	if err == nil || processed {
		t.Fatalf("processed=%v err=%v, want the gateway's error", processed, err)
	}
	if calls != 1 || charged.Load() != 1 {
		t.Fatalf("fn ran %d times and the gateway charged %d times, want 1 and 1", calls, charged.Load())
	}
	if pgdedup.IsTransient(err) {
		t.Fatalf("IsTransient(%v) = true, want false: the gateway may have charged", err)
	}
	if recorded(t, b.pool, "billing", "pay-1") {
		t.Fatal("the ID was recorded although fn failed")
	}
}

// fn decodes an empty body: the decoder's io.EOF comes back after one attempt,
// unchanged, and is not transient (requeueing the poison message would loop).
func TestProcessDoesNotRetryDecoderEOF(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			b := setup(t, pgdedup.Config{})
			ctx := ctxT(t)
			calls := 0
			decode := func() error {
				calls++
				var v struct{ Amount int }
				return json.NewDecoder(strings.NewReader("")).Decode(&v)
			}
			var err error
			if batch {
				_, err = b.store.ProcessBatch(ctx, []string{"m1"}, func(context.Context, pgx.Tx, []string) error { return decode() })
			} else {
				_, err = b.store.Process(ctx, "m1", func(context.Context, pgx.Tx) error { return decode() })
			}
			if !errors.Is(err, io.EOF) || calls != 1 || pgdedup.IsTransient(err) {
				t.Fatalf("err=%v calls=%d transient=%v, want io.EOF after 1 call, not transient", err, calls, pgdedup.IsTransient(err))
			}
		})
	}
}

// The network under fn's transaction fails (the client side of its
// connection is closed, as when a link drops): fn's statement fails with a
// network error, pgx closes the connection, and Process retries on a new one.
func TestProcessRetriesConnectionCutMidFn(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	var mu sync.Mutex
	var conns []net.Conn
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
		return c, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	processed, err := store.Process(ctx, "msg-1", func(ctx context.Context, tx pgx.Tx) error {
		calls++
		if err := charge("order-1")(ctx, tx); err != nil {
			return err
		}
		if calls == 1 {
			mu.Lock()
			for _, c := range conns {
				c.Close()
			}
			mu.Unlock()
			_, err := tx.Exec(ctx, `SELECT 1`)
			return fmt.Errorf("charge: %w", err)
		}
		return nil
	})
	if err != nil || !processed || calls != 2 {
		t.Fatalf("processed=%v err=%v calls=%d, want true, nil, 2", processed, err, calls)
	}
	if got := chargesPerOrder(t, b.pool)["order-1"]; got != 1 {
		t.Fatalf("order-1 charged %d times, want 1", got)
	}
}

// Through database/sql (pgx's stdlib driver), a serialization failure and a
// deadlock are transient by their SQLSTATE, and a unique violation is not.
func TestIsTransientThroughDatabaseSQL(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	db := stdlib.OpenDBFromPool(b.pool)
	defer db.Close()
	for code, want := range map[string]bool{"40001": true, "40P01": true, "23505": false} {
		_, err := db.ExecContext(ctx, fmt.Sprintf(`DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '%s'; END $$`, code))
		if got := pgdedup.IsTransient(err); err == nil || got != want {
			t.Errorf("%s through database/sql: err=%v, IsTransient=%v, want %v", code, err, got, want)
		}
	}
}

// gatewayError is a payment gateway client's error that exposes a SQLSTATE of
// its own: 40001, "try again later" in the gateway's protocol.
type gatewayError struct{}

func (gatewayError) Error() string    { return "gateway: conflict, retry later" }
func (gatewayError) SQLState() string { return "40001" }

// processCalls are the four calls that run fn in a transaction of their own,
// each running fn once per attempt on the ID or offset "m1"/1. They share one
// engine path, so fn's errors are retried alike.
var processCalls = map[string]func(ctx context.Context, s *pgdedup.Store, fn func(context.Context, pgx.Tx) error) (bool, error){
	"Process": func(ctx context.Context, s *pgdedup.Store, fn func(context.Context, pgx.Tx) error) (bool, error) {
		return s.Process(ctx, "m1", fn)
	},
	"ProcessBatch": func(ctx context.Context, s *pgdedup.Store, fn func(context.Context, pgx.Tx) error) (bool, error) {
		fresh, err := s.ProcessBatch(ctx, []string{"m1"}, func(ctx context.Context, tx pgx.Tx, _ []string) error { return fn(ctx, tx) })
		return len(fresh) == 1, err
	},
	"ProcessOffsets": func(ctx context.Context, s *pgdedup.Store, fn func(context.Context, pgx.Tx) error) (bool, error) {
		fresh, err := s.ProcessOffsets(ctx, pgdedup.TopicPartition{Topic: "orders"}, []int64{1}, func(ctx context.Context, tx pgx.Tx, _ []int64) error { return fn(ctx, tx) })
		return len(fresh) == 1, err
	},
	"ProcessResult": func(ctx context.Context, s *pgdedup.Store, fn func(context.Context, pgx.Tx) error) (bool, error) {
		_, processed, err := s.ProcessResult(ctx, "m1", func(ctx context.Context, tx pgx.Tx) ([]byte, error) { return []byte("ok"), fn(ctx, tx) })
		return processed, err
	},
}

// fn writes to a second database connection (a ledger service's pool, here
// through a proxy), which drops mid-fn after the ledger's row committed.
// pgdedup's own transaction is intact: fn's error comes back after one call
// (a retry would write the ledger's row twice) and is not transient (the
// caller must not requeue on it either).
func TestProcessDoesNotRetryAnotherConnection(t *testing.T) {
	t.Parallel()
	for name, call := range processCalls {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, pgdedup.Config{})
			ctx := ctxT(t)
			mustExec(t, b.pool, `CREATE TABLE ledger (id bigserial PRIMARY KEY, entry text NOT NULL)`)
			proxy, proxied := pgtest.NewProxy(t, b.db.URL, wireproxy.Config{})
			ledger := pgtest.Pool(t, proxied, 1)
			mustExec(t, ledger, `SELECT 1`) // the ledger's connection is open before fn
			calls := 0
			processed, err := call(ctx, b.store, func(ctx context.Context, tx pgx.Tx) error {
				calls++
				if err := charge("order-1")(ctx, tx); err != nil {
					return err
				}
				if _, err := ledger.Exec(ctx, `INSERT INTO ledger (entry) VALUES ('debit order-1')`); err != nil {
					return fmt.Errorf("ledger: %w", err)
				}
				proxy.Close() // the ledger's connection drops
				if _, err := ledger.Exec(ctx, `INSERT INTO ledger (entry) VALUES ('fee order-1')`); err != nil {
					return fmt.Errorf("ledger: %w", err)
				}
				return nil
			})
			if err == nil || processed {
				t.Fatalf("processed=%v err=%v, want the ledger's error", processed, err)
			}
			if calls != 1 {
				t.Fatalf("fn ran %d times, want 1: the ledger's row was written %d times", calls, calls)
			}
			if pgdedup.IsTransient(err) {
				t.Fatalf("IsTransient(%v) = true, want false: pgdedup's transaction did not fail", err)
			}
			var n int
			if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&n); err != nil || n != 1 {
				t.Fatalf("ledger has %d rows (%v), want 1", n, err)
			}
			if recorded(t, b.pool, "billing", "m1") || len(chargesPerOrder(t, b.pool)) != 0 {
				t.Fatal("fn's error left the ID recorded or the charge written")
			}
		})
	}
}

// fn calls a payment gateway whose client error carries SQLSTATE 40001 (in
// the gateway's protocol, not PostgreSQL's). pgdedup's own transaction did
// not fail by a serialization failure: intact, or aborted by another error
// (a unique violation) that fn did not return. One call, the error as fn
// returned it, not transient.
func TestProcessDoesNotRetryForeignSQLState(t *testing.T) {
	t.Parallel()
	for name, call := range processCalls {
		for _, aborted := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/aborted=%v", name, aborted), func(t *testing.T) {
				t.Parallel()
				b := setup(t, pgdedup.Config{})
				ctx := ctxT(t)
				calls := 0
				processed, err := call(ctx, b.store, func(ctx context.Context, tx pgx.Tx) error {
					calls++
					if err := charge("order-1")(ctx, tx); err != nil {
						return err
					}
					if aborted {
						_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '23505'; END $$`)
						if err == nil {
							t.Fatal("the unique violation was not raised")
						}
					}
					return fmt.Errorf("charge order-1: %w", gatewayError{})
				})
				if !errors.As(err, new(gatewayError)) || processed || calls != 1 {
					t.Fatalf("processed=%v err=%v calls=%d, want the gateway's error after 1 call", processed, err, calls)
				}
				if err.Error() != "charge order-1: gateway: conflict, retry later" {
					t.Fatalf("err = %q, want fn's error unchanged", err)
				}
				if pgdedup.IsTransient(err) {
					t.Fatalf("IsTransient(%v) = true, want false: pgdedup's transaction did not fail", err)
				}
				if recorded(t, b.pool, "billing", "m1") {
					t.Fatal("the ID was recorded although fn failed")
				}
			})
		}
	}
}

// Failures of pgdedup's own transaction under fn are still retried, through
// each of the four calls: its backend terminated, its connection cut, a
// serialization failure raised in it. When the attempts run out, the error
// returned is transient: the caller can requeue.
func TestProcessRetriesOwnTransaction(t *testing.T) {
	t.Parallel()
	failures := map[string]func(t *testing.T, b *bundle, ctx context.Context, tx pgx.Tx) error{
		"backend terminated": func(t *testing.T, b *bundle, ctx context.Context, tx pgx.Tx) error {
			var pid int
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			if _, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend($1::int)`, pid); err != nil {
				t.Fatal(err)
			}
			_, err := tx.Exec(ctx, `SELECT 1`)
			return fmt.Errorf("charge: %w", err)
		},
		"connection closed": func(t *testing.T, b *bundle, ctx context.Context, tx pgx.Tx) error {
			tx.Conn().PgConn().Close(ctx) //nolint:errcheck // what is tested is fn's next statement
			_, err := tx.Exec(ctx, `SELECT 1`)
			return fmt.Errorf("charge: %w", err)
		},
		"serialization failure": func(t *testing.T, b *bundle, ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END $$`)
			return fmt.Errorf("charge: %w", err)
		},
		"deadlock": func(t *testing.T, b *bundle, ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40P01'; END $$`)
			return fmt.Errorf("charge: %w", err)
		},
	}
	for name, call := range processCalls {
		for failure, fail := range failures {
			t.Run(name+"/"+failure, func(t *testing.T) {
				t.Parallel()
				b := setup(t, pgdedup.Config{})
				ctx := ctxT(t)
				calls := 0
				processed, err := call(ctx, b.store, func(ctx context.Context, tx pgx.Tx) error {
					calls++
					if err := charge("order-1")(ctx, tx); err != nil {
						return err
					}
					if calls == 1 {
						return fail(t, b, ctx, tx)
					}
					return nil
				})
				if err != nil || !processed || calls != 2 {
					t.Fatalf("processed=%v err=%v calls=%d, want true, nil, 2", processed, err, calls)
				}
				if got := chargesPerOrder(t, b.pool)["order-1"]; got != 1 {
					t.Fatalf("order-1 charged %d times, want 1", got)
				}
				// Every attempt fails: the last failure comes back transient.
				b2 := setup(t, pgdedup.Config{MaxAttempts: 2})
				calls = 0
				_, err = call(ctx, b2.store, func(ctx context.Context, tx pgx.Tx) error {
					calls++
					return fail(t, b2, ctx, tx)
				})
				if err == nil || calls != 2 || !pgdedup.IsTransient(err) {
					t.Fatalf("err=%v calls=%d transient=%v, want a transient error after 2 calls", err, calls, pgdedup.IsTransient(err))
				}
			})
		}
	}
}

// A real serialization failure of pgdedup's own SERIALIZABLE transaction
// (write skew with another transaction that commits first) is retried.
func TestProcessRetriesOwnSerializationFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}})
	ctx := ctxT(t)
	mustExec(t, b.pool, `CREATE TABLE oncall (doctor text PRIMARY KEY, on_call bool NOT NULL)`)
	mustExec(t, b.pool, `INSERT INTO oncall VALUES ('alice', true), ('bob', true)`)
	calls := 0
	var firstErr error
	processed, err := b.store.Process(ctx, "m1", func(ctx context.Context, tx pgx.Tx) error {
		calls++
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM oncall WHERE on_call`).Scan(&n); err != nil {
			return err
		}
		if calls == 1 {
			// Bob's transaction reads the same rows and takes Bob off call, and
			// commits first.
			other, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
			if err != nil {
				t.Fatal(err)
			}
			mustExec(t, other, `SELECT count(*) FROM oncall WHERE on_call`)
			mustExec(t, other, `UPDATE oncall SET on_call = false WHERE doctor = 'bob'`)
			if err := other.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if n < 2 {
			return nil // someone must stay on call
		}
		_, err := tx.Exec(ctx, `UPDATE oncall SET on_call = false WHERE doctor = 'alice'`)
		if calls == 1 {
			firstErr = err
		}
		return err
	})
	if err != nil || !processed || calls != 2 {
		t.Fatalf("processed=%v err=%v calls=%d, want true, nil, 2", processed, err, calls)
	}
	var pgErr *pgconn.PgError
	if !errors.As(firstErr, &pgErr) || pgErr.Code != "40001" {
		t.Fatalf("the first attempt failed with %v, want a serialization failure", firstErr)
	}
	var onCall int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM oncall WHERE on_call`).Scan(&onCall); err != nil || onCall != 1 {
		t.Fatalf("%d doctors on call (%v), want 1", onCall, err)
	}
}
