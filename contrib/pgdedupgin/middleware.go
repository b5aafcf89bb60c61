package pgdedupgin

import (
	"bufio"
	"errors"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/pgdedup/pgdedup/idempotency"
)

// ErrBuffered is what Hijack returns inside [Middleware]. The middleware
// buffers the answer to store it, so a handler cannot take the connection.
var ErrBuffered = errors.New("pgdedupgin: the answer of an idempotent handler is buffered: it cannot hijack the connection")

// Middleware returns a gin middleware that runs the rest of the chain inside
// mw. The chain's answer goes to mw's buffer, and mw stores it with the key and
// sends it after COMMIT. When mw answers without running the chain (a replay,
// 409 for a key in flight, 400, 422), the chain is aborted. Requests whose
// method is one of mw's SafeMethods run the chain without a transaction.
func Middleware(mw *idempotency.Middleware) gin.HandlerFunc {
	return func(c *gin.Context) {
		outer := c.Writer
		defer func() { c.Writer = outer }() // also when a handler panics, for gin.Recovery to answer
		errs := len(c.Errors)
		mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inner := &writer{ResponseWriter: w, status: http.StatusOK, size: -1}
			c.Request, c.Writer = r, inner
			c.Next()
			if !inner.Written() && len(c.Errors) > errs {
				inner.WriteHeader(http.StatusInternalServerError)
				inner.WriteHeaderNow()
			}
		})).ServeHTTP(outer, c.Request)
		c.Abort() // the chain ran inside mw, or must not run at all
	}
}

// writer is the gin.ResponseWriter of the chain inside the middleware. It
// writes to the middleware's buffer, with gin's rule that the status is sent
// on the first write (or WriteHeaderNow).
type writer struct {
	http.ResponseWriter
	status int
	size   int // -1 until the header is written
}

var _ gin.ResponseWriter = (*writer)(nil)

func (w *writer) WriteHeader(code int) {
	if code > 0 && !w.Written() {
		w.status = code
	}
}

func (w *writer) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.ResponseWriter.WriteHeader(w.status)
	}
}

func (w *writer) Write(b []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseWriter.Write(b)
	w.size += n
	return n, err
}

func (w *writer) WriteString(s string) (int, error) { return w.Write([]byte(s)) }
func (w *writer) Status() int                       { return w.status }
func (w *writer) Size() int                         { return w.size }
func (w *writer) Written() bool                     { return w.size != -1 }
func (w *writer) Pusher() http.Pusher               { return nil }

// Flush sends nothing, because the answer is sent whole, after COMMIT.
func (w *writer) Flush() { w.WriteHeaderNow() }

// CloseNotify is part of gin.ResponseWriter. Its channel never fires,
// because the request's context says when the client left.
func (w *writer) CloseNotify() <-chan bool { return make(chan bool) }

func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, ErrBuffered }
