package pgtest

import (
	"bytes"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy is a TCP proxy in front of the test database. It counts round trips
// (bursts of client bytes sent after a server reply) and can cut connections
// at COMMIT, to make a commit's outcome unknown to the client.
type Proxy struct {
	ln     net.Listener
	target string

	roundTrips atomic.Int64
	cuts       atomic.Int64 // COMMITs still to cut
	forward    atomic.Bool  // whether a cut COMMIT reaches the server first
	cutDone    atomic.Int64

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

// NewProxy starts a proxy to the host:port of dbURL; it stops when t ends.
func NewProxy(t testing.TB, dbURL string) *Proxy {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil || u.Host == "" {
		t.Fatalf("pgtest: proxy needs a postgres:// URL with a host, got %q", dbURL)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: u.Host}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// URL returns dbURL with its host and port replaced by the proxy's.
func (p *Proxy) URL(dbURL string) string {
	u, _ := url.Parse(dbURL)
	u.Host = p.ln.Addr().String()
	return u.String()
}

// RoundTrips returns the round trips counted so far over all connections.
func (p *Proxy) RoundTrips() int64 { return p.roundTrips.Load() }

// CutCommits makes the proxy cut the next n connections that send COMMIT.
// With forward, the COMMIT reaches the server before the cut (it commits, the
// client never hears so); without, it never arrives (the server rolls back).
func (p *Proxy) CutCommits(n int, forward bool) {
	p.forward.Store(forward)
	p.cuts.Store(int64(n))
}

// Cut returns how many connections were cut at COMMIT.
func (p *Proxy) Cut() int64 { return p.cutDone.Load() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		var replied atomic.Bool
		replied.Store(true)
		p.wg.Add(2)
		go p.clientToServer(c, s, &replied)
		go func() {
			defer p.wg.Done()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					replied.Store(true)
					if _, werr := c.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			c.Close()
			s.Close()
		}()
	}
}

var commitSQL = []byte("commit")

func (p *Proxy) clientToServer(c, s net.Conn, replied *atomic.Bool) {
	defer p.wg.Done()
	defer c.Close()
	defer s.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if replied.Swap(false) {
				p.roundTrips.Add(1)
			}
			if bytes.Contains(bytes.ToLower(chunk), commitSQL) && p.takeCut() {
				if p.forward.Load() {
					_, _ = s.Write(chunk)
				}
				return // closes both sides before any reply reaches the client
			}
			if _, werr := s.Write(chunk); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) takeCut() bool {
	for {
		n := p.cuts.Load()
		if n <= 0 {
			return false
		}
		if p.cuts.CompareAndSwap(n, n-1) {
			p.cutDone.Add(1)
			return true
		}
	}
}

func (p *Proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
