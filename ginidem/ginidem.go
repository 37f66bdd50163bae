// Package ginidem adapts the idem middleware to Gin.
//
//	m, err := idem.New(memstore.New())
//	if err != nil {
//		log.Fatal(err)
//	}
//	r := gin.New()
//	r.Use(gin.Logger(), gin.Recovery(), ginidem.Middleware(m))
//	r.POST("/orders", createOrder)
//
// Put the middleware inside gin.Recovery, so that a panicking handler
// releases the key before Recovery answers 500, and inside gin.Logger, so
// the log shows the final status, replays and refusals included. It may
// also be given to a single route or group: r.POST("/orders",
// ginidem.Middleware(m), createOrder).
//
// The route that scopes a record is c.FullPath() ("/orders/:id"). A request
// that matched no route (FullPath is "") passes through untouched, so Gin's
// 404 and 405 answers are never stored.
//
// While a protected handler runs, c.Writer is a gin.ResponseWriter that
// keeps Gin's semantics (the last c.Status wins, headers go out at the first
// write or WriteHeaderNow, Status, Size and Written report what Gin would)
// and records the response; c.Writer is restored when the handler returns
// or panics. After a replay or a refusal the middleware calls c.Abort, so
// the handlers after it do not run.
package ginidem

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/gin-gonic/gin"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/response"
)

// Middleware returns Gin middleware that runs each protected request
// through m. Use it globally with Engine.Use, on a group, or on a route.
// It panics if m is nil.
func Middleware(m *idem.Middleware) gin.HandlerFunc {
	if m == nil {
		panic("ginidem: nil *idem.Middleware")
	}
	return func(c *gin.Context) {
		ran := false
		m.Serve(c.Writer, c.Request, c.FullPath(), func(w http.ResponseWriter, r *http.Request, cw *response.Capture) {
			ran = true
			c.Request = r
			if cw == nil { // not protected: w is c.Writer
				c.Next()
				return
			}
			orig := c.Writer
			gw := writerPool.Get().(*writer)
			*gw = writer{cw: cw, status: orig.Status(), size: -1}
			c.Writer = gw
			defer func() { c.Writer = orig }()
			c.Next()
			if !gw.Written() && (gw.set || gw.status != http.StatusOK) {
				// Gin only recorded the status: commit it. A handler that
				// set none and wrote nothing is left to the middleware, as
				// on net/http (an implicit 200, or a release when it gave
				// up on a canceled request).
				cw.WriteHeader(gw.status)
			}
			// Like Gin's own Context, the writer is reused once the
			// handlers have returned (not after a panic).
			*gw = writer{}
			writerPool.Put(gw)
		})
		if !ran { // m answered itself: a replay or a refusal
			c.Abort()
		}
	}
}

// writer is the gin.ResponseWriter the handlers see while m records the
// response. Like Gin's own, it only records the status until the first
// Write, WriteHeaderNow or Flush, and the last status recorded wins.
type writer struct {
	cw     *response.Capture
	status int
	set    bool // WriteHeader was called
	size   int  // -1 until the status is committed, then body bytes written
}

var _ gin.ResponseWriter = (*writer)(nil)

var writerPool = sync.Pool{New: func() any { return new(writer) }}

func (w *writer) Header() http.Header { return w.cw.Header() }

func (w *writer) WriteHeader(code int) {
	if code > 0 && !w.Written() {
		w.status, w.set = code, true
	}
}

func (w *writer) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.cw.WriteHeader(w.status)
	}
}

func (w *writer) Write(b []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.cw.Write(b)
	w.size += n
	return n, err
}

func (w *writer) WriteString(s string) (int, error) {
	w.WriteHeaderNow()
	n, err := w.cw.WriteString(s)
	w.size += n
	return n, err
}

func (w *writer) Status() int   { return w.status }
func (w *writer) Size() int     { return w.size }
func (w *writer) Written() bool { return w.size != -1 }

func (w *writer) Flush() { _ = w.FlushError() }

// FlushError lets http.ResponseController report a writer that cannot flush.
func (w *writer) FlushError() error {
	w.WriteHeaderNow()
	return w.cw.FlushError()
}

// errHijackAfterBody is Gin's answer to a Hijack after body bytes.
var errHijackAfterBody = errors.New("ginidem: response body already written")

// Hijack follows Gin: allowed until body bytes were written. It returns an
// error wrapping http.ErrNotSupported when the server's writer cannot
// hijack, where Gin's own writer would panic.
func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.size > 0 {
		return nil, nil, errHijackAfterBody
	}
	w.size = max(w.size, 0)
	if _, ok := response.Innermost(w.cw).(http.Hijacker); !ok {
		return nil, nil, fmt.Errorf("ginidem: hijack: %w", http.ErrNotSupported)
	}
	return w.cw.Hijack()
}

// CloseNotify returns the server's close notification channel, or nil
// (never ready) when the underlying writer has none, as with an
// httptest.ResponseRecorder, where Gin's own writer would panic.
func (w *writer) CloseNotify() <-chan bool {
	if cn, ok := response.Innermost(w.cw).(http.CloseNotifier); ok {
		return cn.CloseNotify()
	}
	return nil
}

func (w *writer) Pusher() http.Pusher {
	p, _ := response.Innermost(w.cw).(http.Pusher)
	return p
}

// Unwrap returns the capture, for http.ResponseController.
func (w *writer) Unwrap() http.ResponseWriter { return w.cw }
