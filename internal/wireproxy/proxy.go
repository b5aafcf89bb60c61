// Package wireproxy is the one TCP proxy that the tests and the benchmarks put
// between a client and PostgreSQL (or Redis). It counts round trips, can hold
// every burst of bytes for a fixed delay each way, like a network, and can cut
// connections around COMMIT to make a commit's outcome unknown to the client.
//
// It is test code kept out of _test.go files so that the root module's tests,
// internal/testing/faults and the bench module (a module of its own in this repository,
// whose import path lies under the root's, so Go lets it import this internal
// package) share it.
package wireproxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Cut is what the proxy does with one COMMIT.
type Cut int

const (
	// Forward passes the COMMIT and its reply through untouched.
	Forward Cut = iota
	// CutBeforeCommit closes the connection instead of forwarding the COMMIT:
	// the server rolls the transaction back, the client sees a broken connection.
	CutBeforeCommit
	// CutAfterCommit forwards the COMMIT, waits for the server's reply (so the
	// commit has landed), drops it and closes the connection: the client cannot
	// tell whether its transaction committed. This is the ambiguous commit.
	CutAfterCommit
)

// Config says where a [Proxy] forwards to and what it does on the way.
type Config struct {
	// Target is the server's host:port, or a socket path with Network "unix".
	Target string
	// Network is the target's network, "tcp" or "unix". Defaults to "tcp".
	Network string
	// Delay holds every burst of bytes this long before passing it on, in
	// each direction. Defaults to 0.
	Delay time.Duration
	// Raw passes the client's bytes through without reading them as PostgreSQL
	// protocol messages, for other servers (Redis): no COMMIT is recognised.
	Raw bool
	// Decide, when set, is asked what to do with every COMMIT, concurrently.
	// When nil, COMMITs are cut as [Proxy.CutCommits] says, else forwarded.
	Decide func() Cut
}

// Stats counts what a [Proxy] has seen and done.
type Stats struct {
	RoundTrips int64 // see [Proxy.RoundTrips]
	Commits    int64 // COMMITs seen, cut or not
	CutBefore  int64 // COMMITs dropped with their connection
	CutAfter   int64 // COMMITs forwarded whose reply was dropped with the connection
}

// Proxy is a running proxy. Start one with [Start] and Close it when done.
type Proxy struct {
	cfg Config
	ln  net.Listener

	roundTrips, commits, cutBefore, cutAfter atomic.Int64

	cutMu   sync.Mutex
	cutN    int // COMMITs still to cut when cfg.Decide is nil
	cutHow  Cut
	mu      sync.Mutex
	links   map[*link]struct{}
	wg      sync.WaitGroup
	closing atomic.Bool
}

// Start listens on a free port of 127.0.0.1 and proxies every connection to
// cfg.Target.
func Start(cfg Config) (*Proxy, error) {
	if cfg.Network == "" {
		cfg.Network = "tcp"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("wireproxy: listen: %w", err)
	}
	p := &Proxy{cfg: cfg, ln: ln, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the host:port clients connect to instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns the postgres:// URL dbURL with its host and port replaced by
// the proxy's.
func (p *Proxy) URL(dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("wireproxy: want a postgres:// URL with a host, got %q", dbURL)
	}
	u.Host = p.Addr()
	return u.String(), nil
}

// RoundTrips is how many round trips all connections made so far. A round
// trip is a burst of bytes from the client that follows a reply from the
// server (or opens the connection): however many queries a pipelined batch
// holds, the client waits for the server once per round trip.
func (p *Proxy) RoundTrips() int64 { return p.roundTrips.Load() }

// CutCommits makes the proxy cut the next n COMMITs, each on its connection,
// as how says. It has no effect when [Config.Decide] is set.
func (p *Proxy) CutCommits(n int, how Cut) {
	p.cutMu.Lock()
	defer p.cutMu.Unlock()
	p.cutN, p.cutHow = n, how
}

// Stats returns the counts so far.
func (p *Proxy) Stats() Stats {
	return Stats{RoundTrips: p.roundTrips.Load(), Commits: p.commits.Load(),
		CutBefore: p.cutBefore.Load(), CutAfter: p.cutAfter.Load()}
}

// Close stops accepting, closes every connection and waits for them to end.
func (p *Proxy) Close() error {
	p.closing.Store(true)
	err := p.ln.Close()
	p.mu.Lock()
	for l := range p.links {
		l.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) decide() Cut {
	if p.cfg.Decide != nil {
		return p.cfg.Decide()
	}
	p.cutMu.Lock()
	defer p.cutMu.Unlock()
	if p.cutN <= 0 {
		return Forward
	}
	p.cutN--
	return p.cutHow
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial(p.cfg.Network, p.cfg.Target)
		if err != nil {
			client.Close()
			continue
		}
		l := &link{p: p, client: client, server: server}
		l.replied.Store(true)
		p.mu.Lock()
		p.links[l] = struct{}{}
		p.mu.Unlock()
		if p.closing.Load() { // Close ran between Accept and the line above
			l.close()
		}
		p.wg.Add(2)
		go l.serverToClient()
		go l.clientToServer()
	}
}

// link is one proxied connection.
type link struct {
	p              *Proxy
	client, server net.Conn
	replied        atomic.Bool // the server spoke last: the client's next bytes start a round trip
	dropReply      atomic.Bool // set before a COMMIT to cut after is forwarded
	once           sync.Once
}

func (l *link) close() {
	l.once.Do(func() {
		l.client.Close()
		l.server.Close()
	})
}

func (l *link) done() {
	l.close()
	l.p.mu.Lock()
	delete(l.p.links, l)
	l.p.mu.Unlock()
	l.p.wg.Done()
}

// serverToClient copies replies. The client sends COMMIT only after it has read
// every earlier reply, so once dropReply is set the next bytes from the server
// are the COMMIT's reply: they are dropped and the connection cut.
func (l *link) serverToClient() {
	defer l.done()
	buf := make([]byte, 64<<10)
	for {
		n, err := l.server.Read(buf)
		if n > 0 {
			l.p.hold(time.Now())
			l.replied.Store(true)
			if l.dropReply.Load() {
				return
			}
			if _, err := l.client.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// hold sleeps until the configured delay after a burst that arrived at start.
func (p *Proxy) hold(start time.Time) {
	if p.cfg.Delay > 0 {
		sleepUntil(start.Add(p.cfg.Delay))
	}
}

// Read reads the client's next bytes, counting a round trip when the server
// spoke last, and holds them for the delay. It is the reader clientToServer
// parses from.
func (l *link) Read(b []byte) (int, error) {
	n, err := l.client.Read(b)
	if n > 0 {
		start := time.Now()
		if l.replied.CompareAndSwap(true, false) {
			l.p.roundTrips.Add(1)
		}
		l.p.hold(start)
	}
	return n, err
}

// clientToServer forwards the client's bytes. Read as PostgreSQL protocol, it
// forwards message by message, buffered and flushed whenever the client has
// nothing more pending, and asks what to do with each COMMIT.
func (l *link) clientToServer() {
	defer l.done()
	if l.p.cfg.Raw {
		_, _ = io.CopyBuffer(l.server, struct{ io.Reader }{l}, make([]byte, 64<<10))
		return
	}
	r := bufio.NewReaderSize(l, 64<<10)
	w := bufio.NewWriterSize(l.server, 64<<10)
	startup := true
	for {
		msg, err := readMessage(r, startup)
		if err != nil {
			return
		}
		if startup {
			// SSLRequest and GSSENCRequest are followed by the real startup message.
			startup = len(msg) == 8 && (binary.BigEndian.Uint32(msg[4:]) == 80877103 || binary.BigEndian.Uint32(msg[4:]) == 80877104)
		} else if isCommit(msg) {
			l.p.commits.Add(1)
			switch l.p.decide() {
			case CutBeforeCommit:
				l.p.cutBefore.Add(1)
				return
			case CutAfterCommit:
				l.p.cutAfter.Add(1)
				l.dropReply.Store(true)
			}
		}
		if _, err := w.Write(msg); err != nil {
			return
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

// readMessage reads one protocol message, header included: a length-prefixed
// startup message, or a type byte and a length.
func readMessage(r *bufio.Reader, startup bool) ([]byte, error) {
	hdr := 5
	if startup {
		hdr = 4
	}
	head, err := r.Peek(hdr)
	if err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(head[hdr-4:]))
	if n < 4 || n > 1<<30 {
		return nil, errors.New("wireproxy: bad message length")
	}
	msg := make([]byte, hdr-4+n)
	_, err = io.ReadFull(r, msg)
	return msg, err
}

// isCommit reports whether msg is a simple query whose text is COMMIT (what
// pgx's Tx.Commit sends) or END.
func isCommit(msg []byte) bool {
	if msg[0] != 'Q' {
		return false
	}
	q := strings.TrimRight(string(msg[5:]), "\x00")
	q = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(q), ";"))
	return strings.EqualFold(q, "commit") || strings.EqualFold(q, "end")
}
