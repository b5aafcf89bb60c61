package faults

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
)

// Cut is what CommitCutter does with one COMMIT.
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

// CutStats counts what a CommitCutter has seen and done.
type CutStats struct {
	Commits   int64 // COMMITs seen, cut or not
	CutBefore int64 // COMMITs dropped with their connection
	CutAfter  int64 // COMMITs forwarded whose reply was dropped with the connection
}

// CommitCutter is a TCP proxy in front of PostgreSQL that cuts connections
// around COMMIT. It reads the client's protocol messages and asks decide what
// to do with every simple-protocol "commit" (what pgx's Tx.Commit sends); all
// other traffic passes through. decide is called concurrently.
type CommitCutter struct {
	ln     net.Listener
	target string
	decide func() Cut
	wg     sync.WaitGroup

	commits, cutBefore, cutAfter atomic.Int64
}

// NewCommitCutter listens on a free port of 127.0.0.1 and proxies every
// connection to target (host:port). Close it when done.
func NewCommitCutter(target string, decide func() Cut) (*CommitCutter, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faults: proxy listen: %w", err)
	}
	p := &CommitCutter{ln: ln, target: target, decide: decide}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the host:port clients should connect to.
func (p *CommitCutter) Addr() string { return p.ln.Addr().String() }

// Stats returns the counts so far.
func (p *CommitCutter) Stats() CutStats {
	return CutStats{Commits: p.commits.Load(), CutBefore: p.cutBefore.Load(), CutAfter: p.cutAfter.Load()}
}

// Close stops accepting connections. Open ones end when either side closes.
func (p *CommitCutter) Close() error {
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *CommitCutter) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		l := &link{client: client, server: server}
		go l.serverToClient()
		go l.clientToServer(p)
	}
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	dropReply      atomic.Bool // set before a COMMIT to cut after is forwarded
	once           sync.Once
}

func (l *link) close() {
	l.once.Do(func() {
		l.client.Close()
		l.server.Close()
	})
}

// serverToClient copies replies. The client sends COMMIT only after it has read
// every earlier reply, so once dropReply is set the next bytes from the server
// are the COMMIT's reply: they are dropped and the connection cut.
func (l *link) serverToClient() {
	defer l.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := l.server.Read(buf)
		if n > 0 {
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

// clientToServer forwards the client's messages one by one, buffered and
// flushed whenever the client has nothing more pending.
func (l *link) clientToServer(p *CommitCutter) {
	defer l.close()
	r := bufio.NewReaderSize(l.client, 64<<10)
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
			p.commits.Add(1)
			switch p.decide() {
			case CutBeforeCommit:
				p.cutBefore.Add(1)
				return
			case CutAfterCommit:
				p.cutAfter.Add(1)
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
		return nil, errors.New("faults: bad message length")
	}
	msg := make([]byte, hdr-4+n)
	_, err = io.ReadFull(r, msg)
	return msg, err
}

// isCommit reports whether msg is a simple query whose text is COMMIT.
func isCommit(msg []byte) bool {
	if msg[0] != 'Q' {
		return false
	}
	q := strings.TrimRight(string(msg[5:]), "\x00")
	q = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(q), ";"))
	return strings.EqualFold(q, "commit") || strings.EqualFold(q, "end")
}
