package pgdedupgin_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// Through gin, the middleware reads the body before taking a turn on the
// database, and its read deadline reaches the connection through gin's
// ResponseWriter. A client that stalls after one byte of its body gets 408,
// and meanwhile another client's keyed request, with MaxInFlight 1, gets 201.
func TestStalledBodyThroughGin(t *testing.T) {
	t.Parallel()
	a := newAPIWith(t, idempotency.Config{MaxInFlight: 1, AcquireTimeout: 200 * time.Millisecond, RequestBodyTimeout: 3 * time.Second})

	addr := strings.TrimPrefix(a.url, "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"item":"stalled"}`
	fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: %s\r\nX-Test-User: mallory\r\nX-Test-Watch: 1\r\nIdempotency-Key: slow\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", addr, len(body), body[:1])
	<-a.reading

	if r := post(t, a.url, "k1", `{"item":"book"}`); r.status != 201 {
		t.Fatalf("another client's request while a body stalls: %d %s, want 201", r.status, r.body)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("the stalled body: %d, want 408", resp.StatusCode)
	}
	if n := pgdeduptest.Count(t, a.pool, `SELECT count(*) FROM orders WHERE item = 'stalled'`); n != 0 {
		t.Fatalf("%d stalled orders written, want 0", n)
	}
}
