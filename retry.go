package pgdedup

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// retry runs attempt until it succeeds, fails permanently, MaxAttempts is
// reached or ctx is done, sleeping a jittered, growing backoff in between.
func (s *Store) retry(ctx context.Context, id string, attempt func() error) error {
	for n := 1; ; n++ {
		err := attempt()
		if err == nil || n >= s.cfg.MaxAttempts || ctx.Err() != nil || !IsTransient(err) {
			return err
		}
		s.log.WarnContext(ctx, "pgdedup: retrying after transient failure",
			"consumer", s.cfg.Consumer, "message_id", id, "attempt", n, "error", err)
		s.emit(ctx, Event{Kind: EventRetry, MessageID: id, Attempt: n, Err: err})
		t := time.NewTimer(backoff(n))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// backoff returns the pause after failed attempt n (from 1): 10ms doubling up
// to 1s, with full jitter in its upper half so that colliding consumers spread.
func backoff(n int) time.Duration {
	d := min(10*time.Millisecond<<min(n-1, 7), time.Second)
	return d/2 + rand.N(d/2)
}

// IsTransient reports whether err is a failure that trying again can cure:
// a serialization failure (40001), a deadlock (40P01), a lost or refused
// connection, or a server shutting down or starting up. It classifies by
// SQLSTATE and error type, never by message text. [Store.Process] retries these itself;
// IsTransient is exported for consumers deciding whether to requeue.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", // serialization_failure
			"40P01", // deadlock_detected
			"57P01", // admin_shutdown
			"57P02", // crash_shutdown
			"57P03": // cannot_connect_now
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08") // connection_exception
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return pgconn.SafeToRetry(err) ||
		errors.As(err, &connectErr) ||
		errors.As(err, &netErr) ||
		errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNREFUSED)
}
