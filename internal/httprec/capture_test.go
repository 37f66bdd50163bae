package httprec

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeWriter is a bare http.ResponseWriter: no Flush, Hijack or Unwrap. It
// logs every WriteHeader and accepts at most accept bytes per Write (all when
// accept < 0), returning err when it accepts fewer.
type fakeWriter struct {
	h       http.Header
	headers []int
	body    bytes.Buffer
	accept  int
	err     error
}

func newFake() *fakeWriter { return &fakeWriter{h: http.Header{}, accept: -1} }

func (f *fakeWriter) Header() http.Header { return f.h }
func (f *fakeWriter) WriteHeader(code int) {
	f.headers = append(f.headers, code)
}

func (f *fakeWriter) Write(p []byte) (int, error) {
	if f.accept >= 0 && len(p) > f.accept {
		f.body.Write(p[:f.accept])
		return f.accept, f.err
	}
	return f.body.Write(p)
}

// flushFake adds Flush to fakeWriter.
type flushFake struct {
	*fakeWriter
	flushes int
}

func (f *flushFake) Flush() { f.flushes++ }

// unwrapOnly hides everything of the writer it wraps but Unwrap.
type unwrapOnly struct{ http.ResponseWriter }

func (u unwrapOnly) Unwrap() http.ResponseWriter { return u.ResponseWriter }

func TestCaptureInterfaces(t *testing.T) {
	t.Parallel()
	var w any = NewCapture(newFake(), 0, nil)
	if _, ok := w.(io.ReaderFrom); ok {
		t.Error("Capture implements io.ReaderFrom: io.Copy would bypass the capture")
	}
	//lint:ignore SA1019 checking that the deprecated interface is absent.
	if _, ok := w.(http.CloseNotifier); ok {
		t.Error("Capture implements http.CloseNotifier")
	}
	for name, ok := range map[string]bool{
		"http.Flusher":    is[http.Flusher](w),
		"FlushError":      is[interface{ FlushError() error }](w),
		"http.Hijacker":   is[http.Hijacker](w),
		"io.StringWriter": is[io.StringWriter](w),
		"Unwrap":          is[interface{ Unwrap() http.ResponseWriter }](w),
	} {
		if !ok {
			t.Errorf("Capture does not implement %s", name)
		}
	}
}

func is[T any](v any) bool { _, ok := v.(T); return ok }

func TestCaptureStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		run  func(c *Capture)
		// after run, before Finish
		committed bool
		status    int
		sent      []int // WriteHeader calls the inner writer got
		// after Finish
		final     int
		finalSent []int
	}{
		{"nothing", func(c *Capture) {}, false, 0, nil, 200, []int{200}},
		{"WriteHeader is held until the body", func(c *Capture) { c.WriteHeader(201) }, true, 201, nil, 201, []int{201}},
		{"Write sends the status", func(c *Capture) {
			c.WriteHeader(201)
			c.Write([]byte("x"))
		}, true, 201, []int{201}, 201, []int{201}},
		{"implicit 200 on Write", func(c *Capture) { c.Write([]byte("x")) }, true, 200, []int{200}, 200, []int{200}},
		{"implicit 200 on WriteString", func(c *Capture) { c.WriteString("x") }, true, 200, []int{200}, 200, []int{200}},
		{"empty Write commits without sending", func(c *Capture) { c.Write(nil) }, true, 200, nil, 200, []int{200}},
		{"first final status wins", func(c *Capture) {
			c.WriteHeader(202)
			c.WriteHeader(500)
			c.Write([]byte("x"))
			c.WriteHeader(404)
		}, true, 202, []int{202}, 202, []int{202}},
		{"1xx goes out at once and commits nothing", func(c *Capture) {
			c.WriteHeader(100)
			c.WriteHeader(103)
			c.WriteHeader(102)
		}, false, 0, []int{100, 103, 102}, 200, []int{100, 103, 102, 200}},
		{"103 then 200", func(c *Capture) {
			c.WriteHeader(103)
			c.WriteHeader(200)
		}, true, 200, []int{103}, 200, []int{103, 200}},
		{"101 is final", func(c *Capture) { c.WriteHeader(101) }, true, 101, nil, 101, []int{101}},
		{"1xx after the final status is ignored", func(c *Capture) {
			c.WriteHeader(200)
			c.WriteHeader(103)
		}, true, 200, nil, 200, []int{200}},
		{"invalid code goes to the inner writer unrecorded", func(c *Capture) { c.WriteHeader(1000) }, false, 0, []int{1000}, 200, []int{1000, 200}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFake()
			c := NewCapture(f, 100, nil)
			tt.run(c)
			if c.Committed() != tt.committed || c.Status() != tt.status || !slices.Equal(f.headers, tt.sent) {
				t.Errorf("before Finish: Committed %v Status %d inner got %v; want %v %d %v",
					c.Committed(), c.Status(), f.headers, tt.committed, tt.status, tt.sent)
			}
			c.Finish()
			c.Finish()
			if !c.Committed() || c.Status() != tt.final || !slices.Equal(f.headers, tt.finalSent) {
				t.Errorf("after Finish: Committed %v Status %d inner got %v; want true %d %v",
					c.Committed(), c.Status(), f.headers, tt.final, tt.finalSent)
			}
			rec, ok := c.Record()
			if !ok || rec.Status != tt.final {
				t.Errorf("Record = %d, %v", rec.Status, ok)
			}
		})
	}
}

func TestCaptureContentType(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		header http.Header
		status int
		writes []string
		flush  bool // Flush before writing
		want   []string
		absent bool // no Content-Type key in the record
	}{
		{name: "sniffed", writes: []string{"<html>x"}, want: []string{"text/html; charset=utf-8"}},
		{name: "sniffed on the first non-empty write", writes: []string{"", "%PDF-", "<html>"}, want: []string{"application/pdf"}},
		{name: "explicit", header: http.Header{"Content-Type": {"application/json"}}, writes: []string{"<html>"}, want: []string{"application/json"}},
		{name: "explicit nil stays nil", header: http.Header{"Content-Type": nil}, writes: []string{"<html>"}, want: nil},
		{name: "no body", writes: nil, want: nil},
		{name: "flushed before the body", flush: true, writes: []string{"<html>"}, want: nil},
		{name: "Content-Encoding", header: http.Header{"Content-Encoding": {"gzip"}}, writes: []string{"\x1f\x8b"}, want: nil},
		{name: "empty Content-Encoding still sniffs", header: http.Header{"Content-Encoding": {""}}, writes: []string{"<html>"}, want: []string{"text/html; charset=utf-8"}},
		{name: "Transfer-Encoding", header: http.Header{"Transfer-Encoding": {"chunked"}}, writes: []string{"<html>"}, want: nil},
		{name: "204", status: 204, writes: []string{"<html>"}, absent: true},
		{name: "304", status: 304, absent: true},
	}
	for _, tt := range tests {
		for _, viaString := range []bool{false, true} {
			name := tt.name
			if viaString {
				name += "/WriteString"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				f := &flushFake{fakeWriter: newFake()}
				c := NewCapture(f, 100, nil)
				for k, vv := range tt.header { // set by the handler
					c.Header()[k] = vv
				}
				if tt.status != 0 {
					c.WriteHeader(tt.status)
				}
				if tt.flush {
					c.Flush()
				}
				for _, s := range tt.writes {
					if viaString {
						c.WriteString(s)
					} else {
						c.Write([]byte(s))
					}
				}
				rec, ok := c.Record()
				if !ok {
					t.Fatal("not replayable")
				}
				got, present := rec.Header["Content-Type"]
				if tt.absent {
					if present {
						t.Errorf("record has Content-Type %q", got)
					}
					return
				}
				if !present || !slices.Equal(got, tt.want) {
					t.Errorf("record Content-Type %q (present %v), want %q", got, present, tt.want)
				}
				// The inner writer's header map, which net/http sends, agrees.
				if live := f.h["Content-Type"]; !slices.Equal(live, tt.want) {
					t.Errorf("live Content-Type %q, want %q", live, tt.want)
				}
			})
		}
	}
}

// A write the connection refuses (the client went away, a write deadline
// passed) keeps the handler's bytes all the same, but the capture cannot
// tell whether the handler then stopped early: without a Content-Length
// the response is not replayable.
func TestCaptureShortWrite(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.accept, f.err = 3, errors.New("short")
	c := NewCapture(f, 100, nil)
	n, err := c.Write([]byte("abcdef"))
	if n != 3 || err != f.err {
		t.Errorf("Write = %d, %v; want the inner writer's 3, %v", n, err, f.err)
	}
	n, err = c.WriteString("ghijkl")
	if n != 3 || err != f.err {
		t.Errorf("WriteString = %d, %v; want the inner writer's 3, %v", n, err, f.err)
	}
	if !c.Broken() {
		t.Error("Broken() = false after refused writes")
	}
	rec, ok := c.Record()
	if ok || !rec.NotReplayable || rec.Status != 200 || rec.Body != nil {
		t.Errorf("Record = %+v, %v; want not replayable with status 200", rec, ok)
	}
}

// With a declared Content-Length that the handler wrote in full, a broken
// connection does not matter: the record holds every byte the handler
// wrote, including those the connection refused.
func TestCaptureShortWriteDeclaredLength(t *testing.T) {
	t.Parallel()
	for _, complete := range []bool{true, false} {
		f := newFake()
		f.accept, f.err = 3, errors.New("short")
		c := NewCapture(f, 100, nil)
		c.Header().Set("Content-Length", "12")
		c.Write([]byte("abcdef"))
		if complete {
			c.WriteString("ghijkl")
		}
		rec, ok := c.Record()
		switch {
		case complete && (!ok || string(rec.Body) != "abcdefghijkl"):
			t.Errorf("complete: Record body %q, %v; want every byte the handler wrote", rec.Body, ok)
		case !complete && (ok || !rec.NotReplayable):
			t.Errorf("cut short: Record = %+v, %v; want not replayable", rec, ok)
		}
	}
}

// Headers that were in the inner writer's map before the capture was made
// belong to the middleware outside it: not recorded, unless the handler
// changed them.
func TestCaptureOuterHeadersNotRecorded(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.h.Set("X-Request-Id", "req-1")
	f.h.Set("Access-Control-Allow-Origin", "https://a.example")
	f.h.Set("Vary", "Origin")
	f.h.Set("Cache-Control", "no-store")
	f.h["X-Empty"] = nil
	c := NewCapture(f, 100, nil)
	h := c.Header()
	h.Set("Content-Type", "application/json") // the handler's own
	h.Add("Vary", "Accept")                   // changed by the handler
	h.Set("Cache-Control", "no-store")        // set again, same value: still the outer's
	h.Set("Trailer", "X-Sum")
	c.WriteHeader(201)
	c.Write([]byte(`{}`))
	h.Set("X-Sum", "1")
	rec, ok := c.Record()
	if !ok {
		t.Fatal("not replayable")
	}
	for _, name := range []string{"X-Request-Id", "Access-Control-Allow-Origin", "Cache-Control", "X-Empty"} {
		if vv, present := rec.Header[name]; present {
			t.Errorf("record holds the outer header %s = %q", name, vv)
		}
	}
	if got := rec.Header["Vary"]; !slices.Equal(got, []string{"Origin", "Accept"}) {
		t.Errorf("record Vary = %q, want the handler's change", got)
	}
	if got := rec.Header.Get("Content-Type"); got != "application/json" {
		t.Errorf("record Content-Type = %q", got)
	}
	if got := rec.Trailer.Get("X-Sum"); got != "1" {
		t.Errorf("record trailer X-Sum = %q", got)
	}
	// The client got the outer headers all the same.
	if f.h.Get("X-Request-Id") != "req-1" {
		t.Error("the outer header did not reach the client")
	}
}

func TestCaptureLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		limit    int
		writes   []string
		overflow bool
	}{
		{"empty body, limit 0", 0, nil, false},
		{"one byte, limit 0", 0, []string{"x"}, true},
		{"negative limit", -5, []string{"x"}, true},
		{"exactly the limit", 6, []string{"abc", "def"}, false},
		{"one past the limit", 6, []string{"abc", "defg"}, true},
		{"over, then more", 2, []string{"abc", "d", "e"}, true},
	}
	for _, tt := range tests {
		for _, viaString := range []bool{false, true} {
			name := tt.name
			if viaString {
				name += "/WriteString"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				f := newFake()
				c := NewCapture(f, tt.limit, nil)
				for _, s := range tt.writes {
					var n int
					if viaString {
						n, _ = c.WriteString(s)
					} else {
						n, _ = c.Write([]byte(s))
					}
					if n != len(s) {
						t.Errorf("wrote %d of %d", n, len(s))
					}
				}
				all := strings.Join(tt.writes, "")
				if f.body.String() != all {
					t.Errorf("the client got %q, want %q", f.body.String(), all)
				}
				if c.Overflowed() != tt.overflow {
					t.Errorf("Overflowed = %v", c.Overflowed())
				}
				rec, ok := c.Record()
				if ok == tt.overflow || rec.NotReplayable != tt.overflow {
					t.Errorf("Record ok %v NotReplayable %v", ok, rec.NotReplayable)
				}
				if tt.overflow {
					if rec.Status != 200 || rec.Header != nil || rec.Body != nil || rec.Trailer != nil {
						t.Errorf("overflowed record %+v", rec)
					}
					if c.body != nil {
						t.Error("the body buffer was kept after an overflow")
					}
				} else if string(rec.Body) != all {
					t.Errorf("Record body %q, want %q", rec.Body, all)
				}
			})
		}
	}
}

func TestCaptureDeclaredLength(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		cl     string
		status int
		body   string
		ok     bool
	}{
		{"matches", "5", 200, "hello", true},
		{"short body", "10", 200, "hello", false},
		{"no body at all", "3", 200, "", false},
		{"invalid Content-Length is ignored", "ten", 200, "hello", true},
		{"204 has no body", "3", 204, "", true},
		{"304 has no body", "3", 304, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := NewCapture(newFake(), 100, nil)
			c.Header().Set("Content-Length", tt.cl)
			c.WriteHeader(tt.status)
			io.WriteString(c, tt.body)
			rec, ok := c.Record()
			if ok != tt.ok || rec.NotReplayable == tt.ok || rec.Status != tt.status {
				t.Errorf("Record = %+v, %v; want ok %v", rec, ok, tt.ok)
			}
			if _, has := rec.Header["Content-Length"]; has {
				t.Error("Content-Length was recorded")
			}
		})
	}
}

func TestOmitted(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding",
		"Upgrade", "TE", "Te", "Date", "Content-Length", "content-length", "date"} {
		if !Omitted(name) {
			t.Errorf("Omitted(%q) = false", name)
		}
	}
	for _, name := range []string{"Trailer", "Content-Type", "Set-Cookie", "Etag", "Location", "X-Date", ""} {
		if Omitted(name) {
			t.Errorf("Omitted(%q) = true", name)
		}
	}
}

func TestCaptureOmit(t *testing.T) {
	t.Parallel()
	f := newFake()
	var asked []string
	omit := func(name string) bool {
		asked = append(asked, name)
		return name == "Set-Cookie" || name == "X-Secret"
	}
	c := NewCapture(f, 100, omit)
	h := c.Header()
	h.Set("Set-Cookie", "s=1")
	h["x-secret"] = []string{"non-canonical key"}
	h.Set("Date", "yesterday")
	h.Set("Connection", "close")
	h.Set("Keep-Alive", "timeout=5")
	h.Set("Content-Length", "2")
	h.Set("Trailer", "X-Sum, X-Secret")
	h.Set("X-Kept", "yes")
	h.Set(http.TrailerPrefix+"X-Early", "prefix keys are not headers")
	io.WriteString(c, "ok")
	h.Set("X-Sum", "42")
	h.Set("X-Secret", "hidden trailer")
	rec, ok := c.Record()
	if !ok {
		t.Fatal("not replayable")
	}
	want := http.Header{
		"Trailer":      {"X-Sum, X-Secret"},
		"X-Kept":       {"yes"},
		"Content-Type": {"text/plain; charset=utf-8"},
	}
	if !headerEqual(rec.Header, want) {
		t.Errorf("recorded header %v, want %v", rec.Header, want)
	}
	wantTrailer := http.Header{"X-Sum": {"42"}, "X-Early": {"prefix keys are not headers"}}
	if !headerEqual(rec.Trailer, wantTrailer) {
		t.Errorf("recorded trailer %v, want %v", rec.Trailer, wantTrailer)
	}
	if !slices.Contains(asked, "X-Secret") || slices.Contains(asked, "x-secret") {
		t.Errorf("omit was asked %q, want canonical names only", asked)
	}
	if f.h.Get("Set-Cookie") != "s=1" || f.h.Get("X-Secret") == "" {
		t.Error("omitted headers did not reach the client's header map")
	}
}

func TestCaptureTrailers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		declare []string
		set     http.Header // set after the body
		want    http.Header
	}{
		{"none", nil, nil, nil},
		{"declared but never set", []string{"X-A"}, nil, nil},
		{"declared, several values and lines", []string{" x-a ,X-B", "X-C"},
			http.Header{"X-A": {"1", "2"}, "X-B": {"3"}, "X-C": {"4"}, "X-Undeclared": {"no"}},
			http.Header{"X-A": {"1", "2"}, "X-B": {"3"}, "X-C": {"4"}}},
		{"declared twice is collected once", []string{"X-A, X-A"}, http.Header{"X-A": {"1"}}, http.Header{"X-A": {"1"}}},
		{"forbidden trailers are dropped as net/http drops them", []string{"Content-Type, If-Match, Host, X-Ok"},
			http.Header{"If-Match": {"x"}, "Host": {"h"}, "X-Ok": {"ok"}},
			http.Header{"X-Ok": {"ok"}}},
		{"prefix and declared", []string{"X-A"},
			http.Header{http.TrailerPrefix + "X-A": {"p"}, "X-A": {"d"}, http.TrailerPrefix + "x-lower": {"l"}},
			http.Header{"X-A": {"p", "d"}, "x-lower": {"l"}}},
		{"empty prefix values are skipped", nil, http.Header{http.TrailerPrefix + "X-Empty": {}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := NewCapture(newFake(), 100, nil)
			if tt.declare != nil {
				c.Header()["Trailer"] = tt.declare
			}
			io.WriteString(c, "body")
			for k, vv := range tt.set {
				c.Header()[k] = vv
			}
			rec, ok := c.Record()
			if !ok {
				t.Fatal("not replayable")
			}
			if !headerEqual(rec.Trailer, tt.want) || (tt.want == nil) != (rec.Trailer == nil) {
				t.Errorf("Trailer %#v, want %#v", rec.Trailer, tt.want)
			}
			// The record does not share the live map's slices.
			for k, vv := range rec.Trailer {
				if len(vv) > 0 {
					vv[0] = "changed"
					for lk, lv := range c.Header() {
						if strings.HasSuffix(lk, k) && slices.Contains(lv, "changed") {
							t.Errorf("trailer %s aliases the live header map", k)
						}
					}
				}
			}
		})
	}
}

func TestCaptureReset(t *testing.T) {
	t.Parallel()
	f1 := newFake()
	omitAll := func(string) bool { return true }
	c := NewCapture(f1, 100, omitAll)
	c.Header().Set("X-First", "1")
	c.WriteHeader(201)
	io.WriteString(c, strings.Repeat("a", 50))
	rec1, _ := c.Record()
	if len(rec1.Header) != 0 {
		t.Errorf("omit ignored: %v", rec1.Header)
	}
	bodyCap := cap(c.body)

	f2 := newFake()
	c.Reset(f2, 100, nil)
	if c.Committed() || c.Status() != 0 || c.Overflowed() || c.Hijacked() || c.Unwrap() != f2 {
		t.Fatal("Reset left state behind")
	}
	if cap(c.body) != bodyCap {
		t.Errorf("Reset dropped the body buffer's capacity")
	}
	c.Header().Set("X-Second", "2")
	io.WriteString(c, "second")
	rec2, ok := c.Record()
	if !ok || rec2.Status != 200 || string(rec2.Body) != "second" || rec2.Header.Get("X-Second") != "2" || rec2.Header.Get("X-First") != "" {
		t.Errorf("after Reset: %+v", rec2)
	}
	if len(f1.headers) != 1 || f1.body.Len() != 50 {
		t.Error("the second response reached the first writer")
	}

	// A huge buffer is not kept for the pool.
	c.Reset(newFake(), 1<<20, nil)
	c.Write(make([]byte, maxPooledBody+1))
	c.Reset(nil, 0, nil)
	if c.body != nil || c.w != nil {
		t.Error("Reset(nil, 0, nil) kept a large buffer or the writer")
	}
}

func TestCaptureFlushAndHijackNotSupported(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"bare", "unwrap to bare"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var inner http.ResponseWriter = newFake()
			if name != "bare" {
				inner = unwrapOnly{inner}
			}
			c := NewCapture(inner, 100, nil)
			if err := c.FlushError(); !errors.Is(err, http.ErrNotSupported) {
				t.Errorf("FlushError = %v", err)
			}
			c.Flush()
			rc := http.NewResponseController(c)
			if err := rc.Flush(); !errors.Is(err, http.ErrNotSupported) {
				t.Errorf("ResponseController.Flush = %v", err)
			}
			if c.Committed() {
				t.Error("a Flush that is not supported committed the status")
			}
			if _, _, err := rc.Hijack(); !errors.Is(err, http.ErrNotSupported) {
				t.Errorf("ResponseController.Hijack = %v", err)
			}
			if _, _, err := c.Hijack(); !errors.Is(err, http.ErrNotSupported) {
				t.Errorf("Hijack = %v", err)
			}
			if err := rc.SetWriteDeadline(time.Now()); !errors.Is(err, http.ErrNotSupported) {
				t.Errorf("SetWriteDeadline = %v", err)
			}
			if c.Hijacked() {
				t.Error("Hijacked after a failed hijack")
			}
		})
	}
}

func TestCaptureFlushThroughUnwrap(t *testing.T) {
	t.Parallel()
	f := &flushFake{fakeWriter: newFake()}
	c := NewCapture(unwrapOnly{f}, 100, nil)
	c.WriteHeader(202)
	if err := http.NewResponseController(c).Flush(); err != nil {
		t.Fatal(err)
	}
	if f.flushes != 1 || !slices.Equal(f.headers, []int{202}) {
		t.Errorf("inner flushes %d, headers %v", f.flushes, f.headers)
	}
}

// TestResponseControllerOnRealServer uses a Capture, directly and over a
// writer that only has Unwrap, through http.ResponseController.
func TestResponseControllerOnRealServer(t *testing.T) {
	t.Parallel()
	for _, wrapped := range []bool{false, true} {
		name := "direct"
		if wrapped {
			name = "over an Unwrap-only writer"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			firstRead := make(chan struct{})
			done := make(chan *Capture, 1)
			srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if wrapped {
					w = unwrapOnly{w}
				}
				c := NewCapture(w, 100, nil)
				rc := http.NewResponseController(c)
				if err := rc.SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
					t.Errorf("SetWriteDeadline: %v", err)
				}
				if err := rc.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
					t.Errorf("SetReadDeadline: %v", err)
				}
				if err := rc.EnableFullDuplex(); err != nil {
					t.Errorf("EnableFullDuplex: %v", err)
				}
				io.WriteString(c, "first;")
				if err := rc.Flush(); err != nil {
					t.Errorf("Flush: %v", err)
				}
				// The client must see the first part before the handler ends.
				select {
				case <-firstRead:
				case <-time.After(10 * time.Second):
					t.Error("the flushed bytes did not reach the client")
				}
				io.WriteString(c, "second")
				c.Finish()
				done <- c
			}))
			resp, err := client.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			buf := make([]byte, len("first;"))
			if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first;" {
				t.Fatalf("first read %q, %v", buf, err)
			}
			close(firstRead)
			rest, _ := io.ReadAll(resp.Body)
			c := <-done
			rec, ok := c.Record()
			if !ok || string(rec.Body) != "first;second" || string(rest) != "second" {
				t.Errorf("record %q ok %v, client rest %q", rec.Body, ok, rest)
			}
		})
	}
}

// rawExchange sends a raw HTTP/1.1 request and returns everything the server
// sent until it closed the connection, without the Date line.
func rawExchange(t *testing.T, addr, path string) string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: test\r\nConnection: upgrade\r\nUpgrade: test\r\n\r\n")
	all, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	var lines []string
	for line := range strings.Lines(string(all)) {
		if !strings.HasPrefix(line, "Date: ") {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, "")
}

func TestCaptureHijackOnRealServer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		status  int // WriteHeader before the hijack, 0 for none
		wrapped bool
		want    string
	}{
		{"hijack", 0, false, "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nhijacked"},
		{"hijack over an Unwrap-only writer", 0, true, "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nhijacked"},
		{"101 is sent before the hijack", 101, false, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\nhijacked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			captures := make(chan *Capture, 1)
			handler := func(capture bool) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					var c *Capture
					if tt.wrapped {
						w = unwrapOnly{w}
					}
					if capture {
						c = NewCapture(w, 100, nil)
						w = c
					}
					if tt.status != 0 {
						w.Header().Set("Connection", "Upgrade")
						w.Header().Set("Upgrade", "test")
						w.WriteHeader(tt.status)
					}
					conn, brw, err := http.NewResponseController(w).Hijack()
					if err != nil {
						t.Errorf("Hijack: %v", err)
						return
					}
					if tt.status == 0 {
						brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n")
					}
					brw.WriteString("hijacked")
					brw.Flush()
					conn.Close()
					if c != nil {
						if _, err := w.Write([]byte("late")); !errors.Is(err, http.ErrHijacked) {
							t.Errorf("Write after Hijack = %v, want ErrHijacked", err)
						}
						w.WriteHeader(500)
						if err := c.FlushError(); !errors.Is(err, http.ErrHijacked) {
							t.Errorf("FlushError after Hijack = %v, want ErrHijacked", err)
						}
						c.Finish()
						captures <- c
					}
				}
			}
			mux := http.NewServeMux()
			mux.Handle("/plain", handler(false))
			mux.Handle("/capture", handler(true))
			srv := newServer(t, mux)
			addr := strings.TrimPrefix(srv.URL, "http://")
			plain := rawExchange(t, addr, "/plain")
			got := rawExchange(t, addr, "/capture")
			if plain != tt.want || got != plain {
				t.Errorf("client received\n%q\nunwrapped\n%q\nwant\n%q", got, plain, tt.want)
			}
			var c *Capture
			select {
			case c = <-captures:
			case <-time.After(10 * time.Second):
				t.Fatal("the capturing handler did not finish")
			}
			if !c.Hijacked() {
				t.Error("Hijacked() = false")
			}
			rec, ok := c.Record()
			if ok || !rec.NotReplayable || rec.Status != 0 || rec.Header != nil || rec.Body != nil {
				t.Errorf("Record after hijack = %+v, %v", rec, ok)
			}
		})
	}
}

// TestCaptureRecordCallsFinish: a record can still be taken when the caller
// forgot Finish, because Record calls it.
func TestCaptureRecordCallsFinish(t *testing.T) {
	t.Parallel()
	f := newFake()
	c := NewCapture(f, 10, nil)
	c.WriteHeader(http.StatusAccepted)
	rec, ok := c.Record()
	if !ok || rec.Status != http.StatusAccepted || !slices.Equal(f.headers, []int{202}) {
		t.Errorf("Record = %+v, %v; inner got %v", rec, ok, f.headers)
	}
}

// TestCaptureTruncatedOnRealServer: a body shorter than its declared
// Content-Length breaks the client's read, so the response is not kept.
func TestCaptureTruncatedOnRealServer(t *testing.T) {
	t.Parallel()
	done := make(chan *Capture, 1)
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := NewCapture(w, 100, nil)
		c.Header().Set("Content-Length", "10")
		io.WriteString(c, "short")
		c.Finish()
		done <- c
	}))
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("client read error %v, want io.ErrUnexpectedEOF", err)
	}
	rec, ok := (<-done).Record()
	if ok || !rec.NotReplayable || rec.Status != 200 {
		t.Errorf("Record = %+v, %v; want not replayable", rec, ok)
	}
}

// misbehaving reports more bytes than it was given.
type misbehaving struct{ *fakeWriter }

func (misbehaving) Write(p []byte) (int, error)       { return len(p) + 5, nil }
func (misbehaving) WriteString(s string) (int, error) { return -1, nil }

func TestCaptureMisbehavingInner(t *testing.T) {
	t.Parallel()
	c := NewCapture(misbehaving{newFake()}, 100, nil)
	c.Write([]byte("abc")) // reports more than it was given: taken as all
	c.WriteString("def")   // reports -1: taken as refused, and kept
	if rec, ok := c.Record(); ok || !c.Broken() || rec.Status != 200 {
		t.Errorf("Record = %+v, %v; want not replayable", rec, ok)
	}
}
