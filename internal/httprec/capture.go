package httprec

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// maxPooledBody is the largest body buffer Reset keeps for reuse, so a pool of
// captures does not pin the memory of the largest response it ever saw.
const maxPooledBody = 64 << 10

// sniffLen is how many bytes http.DetectContentType looks at.
const sniffLen = 512

// Capture is an [http.ResponseWriter] that tees the response to the client
// and keeps a copy of it.
//
// It sends everything to the inner writer as the handler writes it (see the
// package documentation for when the status goes out and how Content-Type is
// decided), and keeps the final status, the header snapshot, up to limit body
// bytes and, at the end, the trailers. After the handler returns, call
// [Capture.Finish] and then [Capture.Record].
//
// It keeps what the handler wrote, not what the connection accepted: when a
// write fails because the client went away or a write deadline passed
// (http.Server.WriteTimeout), the bytes are kept all the same, and the
// record is replayable only if the handler still wrote the whole body it
// declared with Content-Length (see [Capture.Record]). Headers that were in
// the inner writer's header map when the capture was made (set by
// middleware outside it) are not recorded unless the handler changed them.
//
// Besides Write, WriteHeader and Header it implements [http.Flusher],
// FlushError, [http.Hijacker], [io.StringWriter] and Unwrap, so
// [http.ResponseController] reaches the inner writer's other features
// (SetReadDeadline, SetWriteDeadline, EnableFullDuplex). It does not implement
// [io.ReaderFrom], so io.Copy is captured too.
//
// A Capture is not safe for concurrent use, like the writer it wraps.
type Capture struct {
	w     http.ResponseWriter
	limit int
	omit  func(string) bool

	status      int   // final status; 0 until committed
	pending     bool  // status committed but not yet sent to w
	hijacked    bool  // the connection was hijacked
	overflow    bool  // more than limit body bytes were written
	broken      bool  // the inner writer failed to take body bytes or a flush
	finished    bool  // Finish was called
	declaredLen int64 // Content-Length sent with the status, -1 if none
	written     int64 // body bytes the handler wrote (and HTTP allowed)

	header http.Header // snapshot taken when the status was sent; reused
	values []string    // backing array of header's values; reused
	body   []byte      // up to limit body bytes; capacity reused

	outer     []outerHeader // the inner writer's headers at Reset; reused
	outerVals []string      // backing array of outer's values; reused
}

// outerHeader is a header that was in the inner writer's map before the
// handler ran, with a copy of its values.
type outerHeader struct {
	name   string
	values []string
	isNil  bool
}

var (
	_ http.ResponseWriter = (*Capture)(nil)
	_ http.Flusher        = (*Capture)(nil)
	_ http.Hijacker       = (*Capture)(nil)
	_ io.StringWriter     = (*Capture)(nil)
)

// NewCapture returns a Capture that writes to w and keeps at most limit body
// bytes (limit <= 0 keeps none: any body overflows). omit, which may be nil,
// reports canonical header names that must not be recorded; the names
// [Omitted] reports are never recorded whatever omit says. Omitted headers
// still reach the client. The headers already in w's header map are noted:
// they belong to whoever set them before the capture (an outer middleware
// setting a request id or CORS headers), and are recorded only if the
// handler changes their values.
func NewCapture(w http.ResponseWriter, limit int, omit func(canonicalName string) bool) *Capture {
	c := new(Capture)
	c.Reset(w, limit, omit)
	return c
}

// Reset makes c a fresh Capture writing to w, as [NewCapture] would, so that
// captures can be reused through a sync.Pool. It keeps the body buffer's
// capacity (up to 64 KiB) and the header snapshot's storage, so a [Record]
// obtained from c before Reset becomes invalid. Reset(nil, 0, nil) drops the
// references to the previous response before c goes back into a pool.
func (c *Capture) Reset(w http.ResponseWriter, limit int, omit func(string) bool) {
	clear(c.header)
	clear(c.values)
	clear(c.outer)
	clear(c.outerVals)
	body := c.body[:0]
	if cap(body) > maxPooledBody {
		body = nil
	}
	*c = Capture{
		w:           w,
		limit:       max(limit, 0),
		omit:        omit,
		declaredLen: -1,
		header:      c.header,
		values:      c.values[:0],
		body:        body,
		outer:       c.outer[:0],
		outerVals:   c.outerVals[:0],
	}
	if w != nil {
		for k, vv := range w.Header() {
			i := len(c.outerVals)
			c.outerVals = append(c.outerVals, vv...)
			c.outer = append(c.outer, outerHeader{name: k, values: c.outerVals[i:len(c.outerVals):len(c.outerVals)], isNil: vv == nil})
		}
	}
}

// fromOuter reports whether the header name still has the values it had
// when the capture was made: set outside, and untouched by the handler.
func (c *Capture) fromOuter(name string, vv []string) bool {
	for i := range c.outer {
		o := &c.outer[i]
		if o.name != name {
			continue
		}
		if o.isNil || vv == nil {
			return o.isNil == (vv == nil)
		}
		return slices.Equal(o.values, vv)
	}
	return false
}

// Unwrap returns the inner writer, for [http.ResponseController].
func (c *Capture) Unwrap() http.ResponseWriter { return c.w }

// Header returns the inner writer's header map: the handler and the capture
// share it.
func (c *Capture) Header() http.Header { return c.w.Header() }

// Status returns the final status committed so far, 0 if none yet.
func (c *Capture) Status() int { return c.status }

// Committed reports whether the final status was committed, by WriteHeader
// with a final code, a Write or a Flush (or by Finish).
func (c *Capture) Committed() bool { return c.status != 0 }

// Sent reports whether any part of the response has gone to the inner
// writer, and so may have reached the client: the status line (at the
// first non-empty Write, a Flush, a Hijack or Finish), body bytes, or the
// connection itself after a hijack. A status committed by WriteHeader
// alone is held back and not yet sent.
func (c *Capture) Sent() bool { return c.hijacked || (c.status != 0 && !c.pending) }

// Hijacked reports whether the connection was hijacked through the capture.
func (c *Capture) Hijacked() bool { return c.hijacked }

// Overflowed reports whether more than limit body bytes were written. The
// client still received all of them; the capture kept none.
func (c *Capture) Overflowed() bool { return c.overflow }

// Broken reports whether the inner writer failed to take body bytes or a
// flush (the client went away, a write deadline passed): what reached the
// client is not what the handler wrote.
func (c *Capture) Broken() bool { return c.broken }

// WriteHeader commits the status code, as net/http does:
//
//   - a code outside 100..999 is passed to the inner writer unrecorded, so
//     the handler gets net/http's own panic, exactly as without the capture;
//   - 100, 102 and 103 are informational: they go to the inner writer at once,
//     with the header map as it is now, and commit nothing;
//   - the first final code (101 or 200..999) wins; later calls, and any call
//     after the final code or a hijack, are ignored.
//
// The final code reaches the inner writer later, at the first non-empty
// Write, Flush, Hijack or Finish, when the header snapshot is taken.
func (c *Capture) WriteHeader(code int) {
	if c.status != 0 || c.hijacked {
		return
	}
	if code < 100 || code > 999 || (code < 200 && code != http.StatusSwitchingProtocols) {
		c.w.WriteHeader(code)
		return
	}
	c.status = code
	c.pending = true
}

// Write writes p to the client (committing an implicit 200 if no status was
// committed yet) and keeps it. It returns the inner writer's result. When the
// inner writer refuses bytes for HTTP's sake (after a 204 net/http accepts
// nothing and returns [http.ErrBodyNotAllowed]; past the declared
// Content-Length it returns [http.ErrContentLength]), only what it accepted
// is kept; when it fails otherwise (the connection is gone), all of p is
// kept and the capture is [Capture.Broken].
func (c *Capture) Write(p []byte) (int, error) {
	if c.hijacked {
		return c.w.Write(p)
	}
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if c.pending {
		if len(p) == 0 {
			return 0, nil
		}
		c.send(p, "")
	}
	n, err := c.w.Write(p)
	c.keep(p[:c.taken(n, len(p), err)])
	return n, err
}

// WriteString is Write for a string; it uses the inner writer's WriteString
// when it has one.
func (c *Capture) WriteString(s string) (int, error) {
	if c.hijacked {
		return io.WriteString(c.w, s)
	}
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if c.pending {
		if len(s) == 0 {
			return 0, nil
		}
		c.send(nil, s)
	}
	n, err := io.WriteString(c.w, s)
	c.keepString(s[:c.taken(n, len(s), err)])
	return n, err
}

// Flush commits the status (an implicit 200 if none) and flushes the inner
// writer. It does nothing if the inner writer cannot flush.
func (c *Capture) Flush() { _ = c.FlushError() }

// FlushError is Flush returning the inner writer's error. When neither the
// inner writer nor anything it unwraps to can flush, it returns an error
// wrapping [http.ErrNotSupported] and commits nothing. After a hijack it
// returns [http.ErrHijacked] (net/http's own writer would panic).
func (c *Capture) FlushError() error {
	if !canFlush(c.w) {
		return fmt.Errorf("%w", http.ErrNotSupported)
	}
	if c.hijacked {
		return http.ErrHijacked
	}
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if c.pending {
		c.send(nil, "")
	}
	err := http.NewResponseController(c.w).Flush()
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		c.broken = true
	}
	return err
}

// taken returns how many of the l bytes the handler wrote count as written,
// given the inner writer's n and err, and notes a broken connection.
func (c *Capture) taken(n, l int, err error) int {
	switch {
	case err == nil && n >= l:
		return l
	case errors.Is(err, http.ErrBodyNotAllowed), errors.Is(err, http.ErrContentLength), errors.Is(err, http.ErrHijacked):
		return clamp(n, l)
	}
	c.broken = true
	return l
}

// Hijack hijacks the connection through the inner writer (or what it unwraps
// to), first sending a committed status as net/http does. After a successful
// hijack the response cannot be replayed. When no writer in the chain can
// hijack, it returns an error wrapping [http.ErrNotSupported].
func (c *Capture) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if !canHijack(c.w) {
		return nil, nil, fmt.Errorf("%w", http.ErrNotSupported)
	}
	if c.pending {
		c.send(nil, "")
	}
	conn, rw, err := http.NewResponseController(c.w).Hijack()
	if err == nil {
		c.hijacked = true
	}
	return conn, rw, err
}

// Finish must be called once the handler has returned (not if it panicked).
// If no final status was committed it commits the implicit 200 net/http sends
// after a handler that wrote nothing, and it sends a status still held back,
// so that [Capture.Status] is final. Calling it again does nothing.
func (c *Capture) Finish() {
	if c.finished {
		return
	}
	c.finished = true
	if c.hijacked {
		return
	}
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if c.pending {
		c.send(nil, "")
	}
}

// Record returns the captured response; it calls [Capture.Finish] first if
// that has not been done.
//
// ok is false when the response cannot be replayed: more than limit body
// bytes were written, the connection was hijacked, the body is shorter than
// the Content-Length the handler declared (note that this also holds for a
// HEAD response that declares the length of a body it does not send), or the
// connection failed while the handler wrote ([Capture.Broken]) and the
// handler had not declared a Content-Length that it then wrote in full: the
// handler may have stopped early because its writes failed, and nothing
// tells a complete body from a cut one. rec then only has NotReplayable set
// and the Status the client got (0 after a hijack, where it is unknown).
//
// With ok true, rec.Body aliases the capture's buffer and rec.Header is the
// capture's header snapshot: both stay valid until [Capture.Reset].
// rec.Trailer is collected now from the live header map: the names the
// Trailer header declared (those net/http sends) and the names set with
// [http.TrailerPrefix], stored without the prefix.
func (c *Capture) Record() (rec Record, ok bool) {
	c.Finish()
	switch {
	case c.hijacked:
		return Record{NotReplayable: true}, false
	case c.overflow,
		c.declaredLen >= 0 && c.written < c.declaredLen && bodyAllowedForStatus(c.status),
		c.broken && c.declaredLen < 0:
		return Record{Status: c.status, NotReplayable: true}, false
	}
	rec = Record{Status: c.status, Header: c.header, Trailer: c.trailers()}
	if len(c.body) > 0 {
		rec.Body = c.body
	}
	return rec, true
}

// send sends the committed status to the inner writer. p or s is the first
// body chunk; both are empty when the status goes out without a body (Flush,
// Hijack, Finish). It settles the Content-Type the way net/http would at this
// point and takes the header snapshot.
func (c *Capture) send(p []byte, s string) {
	c.pending = false
	h := c.w.Header()
	if bodyAllowedForStatus(c.status) {
		if _, ok := h["Content-Type"]; !ok {
			if (len(p) > 0 || len(s) > 0) && h.Get("Content-Encoding") == "" && h.Get("Transfer-Encoding") == "" {
				if len(p) == 0 {
					p = []byte(s[:min(len(s), sniffLen)])
				}
				h["Content-Type"] = []string{http.DetectContentType(p)}
			} else {
				// The client gets no Content-Type; the key without values
				// keeps net/http from sniffing one later or on replay.
				h["Content-Type"] = nil
			}
		}
	}
	if cl := h.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(strings.TrimSpace(cl), 10, 64); err == nil && n >= 0 {
			c.declaredLen = n
		}
	}
	c.snapshot(h)
	c.w.WriteHeader(c.status)
}

// keepName reports whether the header name is recorded.
func (c *Capture) keepName(name string) bool {
	name = http.CanonicalHeaderKey(name)
	return !Omitted(name) && (c.omit == nil || !c.omit(name))
}

// snapshot copies the recorded part of h into c.header.
func (c *Capture) snapshot(h http.Header) {
	if c.header == nil {
		c.header = make(http.Header, len(h))
	}
	for k, vv := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) || !c.keepName(k) || c.fromOuter(k, vv) {
			continue
		}
		if vv == nil {
			c.header[k] = nil
			continue
		}
		i := len(c.values)
		c.values = append(c.values, vv...)
		c.header[k] = c.values[i:len(c.values):len(c.values)]
	}
}

func (c *Capture) keep(p []byte) {
	c.written += int64(len(p))
	if c.overflow || len(p) == 0 {
		return
	}
	if len(p) > c.limit-len(c.body) {
		c.setOverflow()
		return
	}
	c.body = append(c.body, p...)
}

func (c *Capture) keepString(s string) {
	c.written += int64(len(s))
	if c.overflow || len(s) == 0 {
		return
	}
	if len(s) > c.limit-len(c.body) {
		c.setOverflow()
		return
	}
	c.body = append(c.body, s...)
}

func (c *Capture) setOverflow() {
	c.overflow = true
	c.body = nil // release the memory; the response cannot be kept anyway
}

// trailers collects the trailers from the live header map, as net/http's
// server does when it sends them.
func (c *Capture) trailers() http.Header {
	h := c.w.Header()
	var t http.Header
	for k, vv := range h {
		name, ok := strings.CutPrefix(k, http.TrailerPrefix)
		if !ok || name == "" || !c.keepName(name) || len(vv) == 0 || c.fromOuter(k, vv) {
			continue
		}
		if t == nil {
			t = make(http.Header)
		}
		t[name] = append(t[name], vv...)
	}
	var seen [8]string
	done := seen[:0]
	for _, v := range c.header["Trailer"] {
		for v != "" {
			var name string
			name, v = nextElement(v)
			name = http.CanonicalHeaderKey(name)
			if name == "" || !validTrailer(name) || !c.keepName(name) || len(h[name]) == 0 {
				continue
			}
			if containsString(done, name) {
				// Declared twice: net/http sends the values twice, and so
				// does a replay, whose Trailer header is the same.
				continue
			}
			done = append(done, name)
			if t == nil {
				t = make(http.Header)
			}
			t[name] = append(t[name], h[name]...)
		}
	}
	return t
}

// clamp returns n limited to 0..hi, so that a misbehaving inner writer
// reporting a count outside what it was given cannot make the capture panic.
func clamp(n, hi int) int {
	if n < 0 {
		return 0
	}
	return min(n, hi)
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// canFlush reports whether http.ResponseController can flush w.
func canFlush(w http.ResponseWriter) bool {
	for {
		switch t := w.(type) {
		case interface{ FlushError() error }, http.Flusher:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return false
		}
	}
}

// canHijack reports whether http.ResponseController can hijack through w.
func canHijack(w http.ResponseWriter) bool {
	for {
		switch t := w.(type) {
		case http.Hijacker:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return false
		}
	}
}
