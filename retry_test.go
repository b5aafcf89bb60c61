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
