package main

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// proxy is an in-process TCP proxy in front of Postgres or Redis. It counts
// round trips and can add a fixed delay each way, like a same-zone network.
//
// A round trip is a burst of bytes from the client that follows a reply from
// the server (or opens the connection): however many queries a pipelined
// batch holds, the client waits for the server once per round trip.
type proxy struct {
	ln      net.Listener
	network string // of the target: "tcp" or "unix"
	target  string
	delay   time.Duration

	roundTrips atomic.Int64
	mu         sync.Mutex
	conns      map[net.Conn]struct{}
	wg         sync.WaitGroup
}

// startProxy listens on a free loopback port and forwards to target.
func startProxy(network, target string, delay time.Duration) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, network: network, target: target, delay: delay, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to instead of the target.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// RoundTrips is how many round trips all connections made so far.
func (p *proxy) RoundTrips() int64 { return p.roundTrips.Load() }

// Close stops accepting, closes every connection and waits for the pumps.
func (p *proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *proxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial(p.network, p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.track(client, true)
		p.track(server, true)
		// replied is true when the server spoke last: the client's next
		// bytes start a new round trip.
		replied := &atomic.Bool{}
		replied.Store(true)
		p.wg.Add(2)
		go p.pump(server, client, func() {
			if replied.CompareAndSwap(true, false) {
				p.roundTrips.Add(1)
			}
		})
		go p.pump(client, server, func() { replied.Store(true) })
	}
}

// pump copies from src to dst, calling seen on each burst read from src and
// holding each burst for p.delay before writing it. The writes are in order
// and one connection's traffic is request/response, so holding the burst in
// the reading goroutine delays it exactly once.
func (p *proxy) pump(dst, src net.Conn, seen func()) {
	defer p.wg.Done()
	defer func() {
		p.track(src, false)
		p.track(dst, false)
		src.Close()
		dst.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			due := time.Now().Add(p.delay)
			seen()
			if p.delay > 0 {
				sleepUntil(due)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// sleepUntil blocks the goroutine's thread in nanosleep until due. A timer of
// the Go runtime would round a sub-millisecond sleep up to 1 ms when the
// process is idle (epoll_wait counts milliseconds); nanosleep with a 1 µs timer
// slack on the thread wakes on time.
func sleepUntil(due time.Time) {
	const prSetTimerSlack = 29
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, 1000, 0)
	for {
		d := time.Until(due)
		if d <= 0 {
			return
		}
		ts := syscall.NsecToTimespec(d.Nanoseconds())
		if err := syscall.Nanosleep(&ts, nil); err != nil && !errors.Is(err, syscall.EINTR) {
			return
		}
	}
}
