package wireproxy_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/pgtest"
	"github.com/pgdedup/pgdedup/internal/wireproxy"
)

// echoServer answers each burst with the same bytes.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// exchange sends each burst and waits for all of it to come back.
func exchange(t *testing.T, addr string, bursts ...string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	for _, b := range bursts {
		if _, err := io.WriteString(c, b); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(r, make([]byte, len(b))); err != nil {
			t.Fatal(err)
		}
	}
}

func start(t *testing.T, cfg wireproxy.Config) *wireproxy.Proxy {
	t.Helper()
	p, err := wireproxy.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestCountsRoundTripsNotMessages(t *testing.T) {
	t.Parallel()
	p := start(t, wireproxy.Config{Target: echoServer(t), Raw: true})
	// Three pipelined "queries" in one burst, then two single ones: 3 round trips.
	exchange(t, p.Addr(), "BEGIN;INSERT;INSERT;", "INSERT;", "COMMIT;")
	if got := p.RoundTrips(); got != 3 {
		t.Fatalf("counted %d round trips, want 3", got)
	}
}

func TestDelaysEachWay(t *testing.T) {
	t.Parallel()
	const delay = 2 * time.Millisecond
	p := start(t, wireproxy.Config{Target: echoServer(t), Raw: true, Delay: delay})
	begin := time.Now()
	exchange(t, p.Addr(), "a", "b", "c", "d", "e")
	// Five round trips, each delayed on the way there and back.
	if took, least := time.Since(begin), 5*2*delay; took < least {
		t.Fatalf("5 round trips took %s through a %s-each-way proxy, want at least %s", took, delay, least)
	}
	if got := p.RoundTrips(); got != 5 {
		t.Fatalf("counted %d round trips, want 5", got)
	}
}

// A COMMIT cut before it reaches the server rolls the transaction back; one cut
// after it commits it; either way the client gets an error, not an answer. A
// forwarded COMMIT is one round trip.
func TestCutsCommit(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pgtest.Exec(t, db.Pool, `CREATE TABLE t (v text PRIMARY KEY)`)
	for _, c := range []struct {
		how       wireproxy.Cut
		committed bool
	}{{wireproxy.CutBeforeCommit, false}, {wireproxy.CutAfterCommit, true}, {wireproxy.Forward, true}} {
		p, proxied := pgtest.NewProxy(t, db.URL, wireproxy.Config{})
		conn, err := pgx.Connect(ctx, proxied)
		if err != nil {
			t.Fatal(err)
		}
		p.CutCommits(1, c.how)
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		v := time.Now().String()
		if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1)`, v); err != nil {
			t.Fatal(err)
		}
		before := p.RoundTrips()
		err = tx.Commit(ctx)
		// Counted on a connection that carries on; a cut one's client may
		// still write into it as it fails.
		if got := p.RoundTrips() - before; c.how == wireproxy.Forward && got != 1 {
			t.Errorf("COMMIT took %d round trips, want 1", got)
		}
		if c.how == wireproxy.Forward {
			if err != nil {
				t.Fatalf("forwarded COMMIT: %v", err)
			}
			conn.Close(ctx)
		} else if err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("cut %d: COMMIT returned %v, want a connection error", c.how, err)
		}
		if got := pgtest.Count(t, db.Pool, `SELECT count(*) FROM t WHERE v = $1`, v) == 1; got != c.committed {
			t.Errorf("cut %d: committed = %v, want %v", c.how, got, c.committed)
		}
		st := p.Stats()
		if st.Commits != 1 || st.CutBefore+st.CutAfter != int64(min(int(c.how), 1)) {
			t.Errorf("cut %d: stats %+v", c.how, st)
		}
	}
}
