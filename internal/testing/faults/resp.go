package faults

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// RESP is a minimal Redis client speaking RESP2 over one connection, enough
// for the Redis SET NX recipe the suite compares pgdedup with. The root module
// must not depend on a Redis client library, and the recipe needs three
// commands. It is not safe for concurrent use.
type RESP struct {
	conn net.Conn
	r    *bufio.Reader
}

// DialRESP connects to a Redis server at addr (host:port).
func DialRESP(addr string) (*RESP, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("faults: redis %s: %w", addr, err)
	}
	return &RESP{conn: conn, r: bufio.NewReader(conn)}, nil
}

// Close closes the connection.
func (c *RESP) Close() error { return c.conn.Close() }

// Do sends one command and returns its reply: a string (simple or bulk), an
// int64, nil (a nil bulk string or array) or a []any. A Redis error reply is
// returned as an error.
func (c *RESP) Do(args ...string) (any, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if err := c.conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return nil, err
	}
	if _, err := io.WriteString(c.conn, b.String()); err != nil {
		return nil, fmt.Errorf("faults: redis %s: %w", args[0], err)
	}
	reply, err := c.read()
	if err != nil {
		return nil, fmt.Errorf("faults: redis %s: %w", args[0], err)
	}
	return reply, nil
}

func (c *RESP) read() (any, error) {
	line, err := c.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || !strings.HasSuffix(line, "\r\n") {
		return nil, fmt.Errorf("malformed reply %q", line)
	}
	kind, body := line[0], line[1:len(line)-2]
	switch kind {
	case '+':
		return body, nil
	case '-':
		return nil, errors.New(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$', '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err // -1: nil bulk string or array
		}
		if kind == '$' {
			buf := make([]byte, n+2)
			if _, err := io.ReadFull(c.r, buf); err != nil {
				return nil, err
			}
			return string(buf[:n]), nil
		}
		items := make([]any, n)
		for i := range items {
			if items[i], err = c.read(); err != nil {
				return nil, err
			}
		}
		return items, nil
	}
	return nil, fmt.Errorf("unknown reply type %q", kind)
}
