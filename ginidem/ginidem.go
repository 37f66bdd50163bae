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
// or panics. A Hijack that fails sends nothing and leaves the response
// unwritten, so the handler can still answer with any status (with Gin's
// own writer that status would be lost); if Gin's writer underneath then
// still reports another status, the middleware before this one gets a
// c.Writer reporting the status the client got. After a replay or a
// refusal the middleware calls c.Abort, so the handlers after it do not
// run.
package ginidem

import (
	"bufio"
	"errors"
	"fmt"
	"io"
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
		orig := c.Writer
		gw := writerPool.Get().(*writer)
		gw.base = base{w: orig}
		ran := false
		m.Serve(&gw.base, c.Request, c.FullPath(), func(w http.ResponseWriter, r *http.Request) {
			ran = true
			c.Request = r
			if w == http.ResponseWriter(&gw.base) { // not protected: the handlers keep c.Writer
				c.Next()
				return
			}
			gw.cw, gw.status, gw.set, gw.size = w, orig.Status(), false, -1
			c.Writer = gw
			defer func() { c.Writer = orig }()
			c.Next()
			if !gw.Written() && (gw.set || gw.status != http.StatusOK) {
				// Gin only recorded the status: commit it. A handler that
				// set none and wrote nothing is left to the middleware, as
				// on net/http (an implicit 200, or a release when it gave
				// up on a canceled request).
				w.WriteHeader(gw.status)
			}
		})
		if !ran { // m answered itself: a replay or a refusal
			c.Abort()
		}
		if gw.base.raw != nil && gw.base.status != 0 && gw.base.status != orig.Status() {
			// Gin's writer took a failed Hijack for the response being
			// written and ignores the status sent since: report that one.
			c.Writer = &sentStatus{ResponseWriter: orig, status: gw.base.status}
		}
		// Like Gin's own Context, the writer is reused once the handlers
		// have returned (not after a panic).
		*gw = writer{}
		writerPool.Put(gw)
	}
}

// base is the writer m.Serve, and so the capture, writes to: Gin's
// c.Writer, except after a Hijack that failed once Gin's writer had marked
// itself written (it does so before trying, and then ignores any status).
// Nothing was sent then, so base sends the status beneath Gin's writer,
// keeping what the client gets and what is recorded the same.
type base struct {
	w      gin.ResponseWriter
	raw    http.ResponseWriter // beneath w, after such a Hijack
	status int                 // the final status given to w, then sent to raw
}

func (b *base) Header() http.Header { return b.w.Header() }

func (b *base) WriteHeader(code int) {
	if b.status == 0 && (code == http.StatusSwitchingProtocols || code >= 200 && code <= 999) {
		b.status = code
	}
	if b.raw == nil {
		b.w.WriteHeader(code)
		return
	}
	b.raw.WriteHeader(code)
}

// Write, WriteString and Flush go through Gin's writer, which counts the
// bytes; once it is marked written it passes them on as they are.
func (b *base) Write(p []byte) (int, error)       { return b.w.Write(p) }
func (b *base) WriteString(s string) (int, error) { return b.w.WriteString(s) }
func (b *base) Flush()                            { b.w.Flush() }

// Unwrap returns Gin's writer, for http.ResponseController and
// response.Innermost.
func (b *base) Unwrap() http.ResponseWriter { return b.w }

// Hijack hijacks through Gin's writer. If that fails after Gin's writer
// marked itself written, the status it was given (the capture sends a
// committed status before hijacking, as net/http does) goes beneath it.
func (b *base) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	written := b.w.Written()
	conn, rw, err := b.w.Hijack()
	if err != nil && !written && b.w.Written() {
		if u, ok := b.w.(interface{ Unwrap() http.ResponseWriter }); ok {
			b.raw = u.Unwrap()
			if b.status != 0 {
				b.raw.WriteHeader(b.status)
			}
		}
	}
	return conn, rw, err
}

// intact reports whether a status may still be sent after a failed Hijack:
// Gin's writer is not written, or base sends beneath it. It is false when
// Gin's writer was written before, or when it is another middleware's
// gin.ResponseWriter with no Unwrap that a failed Hijack marked written:
// the client then gets an implicit 200, as with Gin alone, and so does the
// record.
func (b *base) intact() bool {
	return b.raw != nil || !b.w.Written()
}

// sentStatus is c.Writer, for the middleware before this one, after base
// sent the status beneath Gin's writer.
type sentStatus struct {
	gin.ResponseWriter
	status int
}

func (s *sentStatus) Status() int                 { return s.status }
func (s *sentStatus) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// writer is the gin.ResponseWriter the handlers see while m records the
// response. Like Gin's own, it only records the status until the first
// Write, WriteHeaderNow or Flush, and the last status recorded wins.
type writer struct {
	base   base                // what m.Serve writes to
	cw     http.ResponseWriter // the middleware's, recording the response
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
	n, err := io.WriteString(w.cw, s)
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
	return http.NewResponseController(w.cw).Flush()
}

// errHijackAfterBody is Gin's answer to a Hijack after body bytes.
var errHijackAfterBody = errors.New("ginidem: response body already written")

// Hijack follows Gin: allowed until body bytes were written, and once it
// succeeds the response counts as written. A Hijack that fails sends
// nothing and leaves the writer as it was, so the handler can still answer
// with any status, where Gin's own writer would panic (the server's writer
// cannot hijack) or lose that status (the hijack returned an error). When
// the server's writer cannot hijack the error wraps http.ErrNotSupported.
func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.size > 0 {
		return nil, nil, errHijackAfterBody
	}
	if _, ok := response.Innermost(w.cw).(http.Hijacker); !ok {
		return nil, nil, fmt.Errorf("ginidem: hijack: %w", http.ErrNotSupported)
	}
	size := w.size
	w.size = 0
	conn, rw, err := http.NewResponseController(w.cw).Hijack()
	if err != nil && w.base.intact() {
		w.size = size
	}
	return conn, rw, err
}

// CloseNotify returns the server's close notification channel, or nil
// (never ready) when the underlying writer has none, as with an
// httptest.ResponseRecorder, where Gin's own writer would panic.
func (w *writer) CloseNotify() <-chan bool {
	//lint:ignore SA1019 gin.ResponseWriter has CloseNotify: Gin's users may call it.
	if cn, ok := response.Innermost(w.cw).(http.CloseNotifier); ok {
		return cn.CloseNotify()
	}
	return nil
}

func (w *writer) Pusher() http.Pusher {
	p, _ := response.Innermost(w.cw).(http.Pusher)
	return p
}

// Unwrap returns the middleware's writer, for http.ResponseController.
func (w *writer) Unwrap() http.ResponseWriter { return w.cw }
