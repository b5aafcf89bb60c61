package main

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

// echoServer answers each line with the same line.
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

func TestProxyCountsRoundTripsNotMessages(t *testing.T) {
	p, err := startProxy("tcp", echoServer(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Three pipelined "queries" in one burst, then two single ones: 3 round trips.
	exchange(t, p.Addr(), "BEGIN;INSERT;INSERT;", "INSERT;", "COMMIT;")
	if got := p.RoundTrips(); got != 3 {
		t.Fatalf("counted %d round trips, want 3", got)
	}
}

func TestProxyDelaysEachWay(t *testing.T) {
	const delay = 2 * time.Millisecond
	p, err := startProxy("tcp", echoServer(t), delay)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	start := time.Now()
	exchange(t, p.Addr(), "a", "b", "c", "d", "e")
	// Five round trips, each delayed on the way there and back.
	if took, least := time.Since(start), 5*2*delay; took < least {
		t.Fatalf("5 round trips took %s through a %s-each-way proxy, want at least %s", took, delay, least)
	}
	if got := p.RoundTrips(); got != 5 {
		t.Fatalf("counted %d round trips, want 5", got)
	}
}
