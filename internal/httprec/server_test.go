package httprec

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
)

// received is what a client received for one request.
type received struct {
	status        int
	header        http.Header
	body          []byte
	trailer       http.Header
	contentLength int64
	chunked       bool
	informational []informational
}

type informational struct {
	code   int
	header http.Header
}

// client does not ask for gzip, so Content-Encoding reaches the test as sent.
var client = &http.Client{Transport: &http.Transport{DisableCompression: true}}

func fetch(t *testing.T, url string) received {
	t.Helper()
	var got received
	trace := &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			got.informational = append(got.informational, informational{code, http.Header(h).Clone()})
			return nil
		},
	}
	ctx := httptrace.WithClientTrace(context.Background(), trace)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader("request body"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	got.body, err = io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the body of %s: %v", url, err)
	}
	got.status = resp.StatusCode
	got.header = resp.Header
	got.trailer = resp.Trailer
	got.contentLength = resp.ContentLength
	got.chunked = slices.Contains(resp.TransferEncoding, "chunked")
	return got
}

// headerWithout returns a copy of h without the names.
func headerWithout(h http.Header, names ...string) http.Header {
	out := make(http.Header, len(h))
	for k, vv := range h {
		if !slices.Contains(names, k) {
			out[k] = vv
		}
	}
	return out
}

func headerEqual(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, av := range a {
		bv, ok := b[k]
		if !ok || !slices.Equal(av, bv) {
			return false
		}
	}
	return true
}

// compare reports the differences between two received responses. With
// framing, Content-Length and chunking must match too.
func compare(t *testing.T, what string, want, got received, framing bool) {
	t.Helper()
	if got.status != want.status {
		t.Errorf("%s: status %d, want %d", what, got.status, want.status)
	}
	ignore := []string{"Date", ReplayedHeader}
	if !framing {
		ignore = append(ignore, "Content-Length")
	}
	if g, w := headerWithout(got.header, ignore...), headerWithout(want.header, ignore...); !headerEqual(g, w) {
		t.Errorf("%s: header\n got %v\nwant %v", what, g, w)
	}
	if !bytes.Equal(got.body, want.body) {
		t.Errorf("%s: body differs: got %d bytes %.80q, want %d bytes %.80q", what, len(got.body), got.body, len(want.body), want.body)
	}
	if !headerEqual(got.trailer, want.trailer) {
		t.Errorf("%s: trailer %v, want %v", what, got.trailer, want.trailer)
	}
	if framing && (got.contentLength != want.contentLength || got.chunked != want.chunked) {
		t.Errorf("%s: framing Content-Length %d chunked %v, want %d %v", what,
			got.contentLength, got.chunked, want.contentLength, want.chunked)
	}
}

// newServer starts a test server that does not log (the unwrapped handlers
// provoke net/http's "superfluous WriteHeader" messages on purpose).
func newServer(t *testing.T, h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// trio serves a handler three ways: unwrapped (/plain), through a Capture
// (/capture, whose encoded record it keeps), and by replaying that record
// (/replay).
type trio struct {
	srv   *httptest.Server
	mu    sync.Mutex
	recs  [][]byte // encodings of the captured records, in order
	capts []*Capture
}

func newTrio(t *testing.T, limit int, omit func(string) bool, h http.HandlerFunc) *trio {
	t.Helper()
	tr := &trio{}
	mux := http.NewServeMux()
	mux.HandleFunc("/plain", h)
	mux.HandleFunc("/capture", func(w http.ResponseWriter, r *http.Request) {
		c := NewCapture(w, limit, omit)
		h(c, r)
		c.Finish()
		rec, ok := c.Record()
		b, err := rec.MarshalBinary()
		if err != nil {
			t.Errorf("MarshalBinary: %v", err)
		}
		if ok == rec.NotReplayable {
			t.Errorf("Record: ok %v but NotReplayable %v", ok, rec.NotReplayable)
		}
		tr.mu.Lock()
		tr.recs = append(tr.recs, b)
		tr.capts = append(tr.capts, c)
		tr.mu.Unlock()
	})
	mux.HandleFunc("/replay", func(w http.ResponseWriter, r *http.Request) {
		var rec Record
		if err := rec.UnmarshalBinary(tr.last(t)); err != nil {
			t.Errorf("UnmarshalBinary: %v", err)
			return
		}
		if err := Replay(w, &rec); err != nil {
			t.Errorf("Replay: %v", err)
		}
	})
	tr.srv = newServer(t, mux)
	return tr
}

func (tr *trio) last(t *testing.T) []byte {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.recs) == 0 {
		t.Fatal("no record captured")
	}
	return tr.recs[len(tr.recs)-1]
}

func (tr *trio) record(t *testing.T) (Record, *Capture) {
	t.Helper()
	var rec Record
	if err := rec.UnmarshalBinary(tr.last(t)); err != nil {
		t.Fatalf("UnmarshalBinary: %v", err)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return rec, tr.capts[len(tr.capts)-1]
}

// chunkReader returns its data n bytes per Read and is neither a
// *bytes.Reader nor an io.WriterTo.
type chunkReader struct {
	data []byte
	n    int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.n)], r.data)
	r.data = r.data[n:]
	return n, nil
}

var (
	htmlPage  = []byte("<!DOCTYPE html><html><head><title>t</title></head><body>" + strings.Repeat("<p>paragraph</p>", 100) + "</body></html>")
	binary256 = func() []byte {
		b := make([]byte, 256)
		for i := range b {
			b[i] = byte(i)
		}
		return b
	}()
)

func gzipped(t *testing.T, s string) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := io.WriteString(zw, s); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestCaptureAndReplayOnRealServer serves each handler unwrapped, captured and
// replayed on a real server and compares what the client received.
func TestCaptureAndReplayOnRealServer(t *testing.T) {
	t.Parallel()
	pdf := filepath.Join(t.TempDir(), "doc.pdf")
	pdfData := append([]byte("%PDF-1.4\n"), bytes.Repeat([]byte("0123456789abcdef"), 5000)...)
	if err := os.WriteFile(pdf, pdfData, 0o600); err != nil {
		t.Fatal(err)
	}
	gz := gzipped(t, "hello, compressed world")

	tests := []struct {
		name    string
		limit   int
		handler http.HandlerFunc
		// differs marks the documented deviations: the captured response
		// differs from the unwrapped one (and is then checked by check).
		differs bool
		// framingDiffers: only Content-Length and chunking may differ
		// between the unwrapped and the captured response.
		framingDiffers bool
		// replayDiffers: check compares the captured and replayed responses.
		replayDiffers bool
		check         func(t *testing.T, plain, capt, replay received, rec Record)
	}{
		{
			name: "html without Content-Type",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Write(htmlPage)
			},
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				if got := capt.header.Get("Content-Type"); got != "text/html; charset=utf-8" {
					t.Errorf("captured Content-Type %q", got)
				}
				if got := rec.Header.Get("Content-Type"); got != "text/html; charset=utf-8" {
					t.Errorf("recorded Content-Type %q", got)
				}
			},
		},
		{
			name: "small chunks with Flush between",
			handler: func(w http.ResponseWriter, r *http.Request) {
				rc := http.NewResponseController(w)
				for _, s := range []string{"<p>one</p>", "<p>two</p>", "<p>three</p>"} {
					io.WriteString(w, s)
					if err := rc.Flush(); err != nil {
						t.Errorf("Flush: %v", err)
					}
				}
			},
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				if !capt.chunked {
					t.Error("the captured response was not streamed")
				}
				if string(rec.Body) != "<p>one</p><p>two</p><p>three</p>" {
					t.Errorf("recorded body %q", rec.Body)
				}
			},
		},
		{
			name: "201 then JSON without Content-Type",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
				w.Write([]byte(`{"id":42,"items":["a","b"]}`))
			},
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				if rec.Status != 201 || rec.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
					t.Errorf("record %d %q", rec.Status, rec.Header.Get("Content-Type"))
				}
			},
		},
		{
			name: "io.Copy from a plain reader",
			handler: func(w http.ResponseWriter, r *http.Request) {
				io.Copy(w, &chunkReader{data: htmlPage, n: 64})
			},
			// net/http's own ReadFrom flushes the header after the first
			// 512 bytes, so unwrapped the short body is chunked; through
			// the capture it goes through Write and gets a Content-Length.
			framingDiffers: true,
		},
		{
			name: "io.Copy from a bytes.Reader",
			handler: func(w http.ResponseWriter, r *http.Request) {
				io.Copy(w, bytes.NewReader(pdfData))
			},
		},
		{
			name:  "io.Copy from an os.File",
			limit: 1 << 20,
			handler: func(w http.ResponseWriter, r *http.Request) {
				f, err := os.Open(pdf)
				if err != nil {
					t.Error(err)
					return
				}
				defer f.Close()
				io.Copy(w, f)
			},
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				if !bytes.Equal(rec.Body, pdfData) || rec.Header.Get("Content-Type") != "application/pdf" {
					t.Errorf("record: %d body bytes, Content-Type %q", len(rec.Body), rec.Header.Get("Content-Type"))
				}
			},
		},
		{
			name: "declared trailers",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Trailer", "X-Checksum, X-Count")
				w.Header().Set("Content-Type", "text/plain")
				io.WriteString(w, "body with trailers")
				w.Header().Set("X-Checksum", "abc123")
				w.Header().Add("X-Count", "1")
				w.Header().Add("X-Count", "2")
			},
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				want := http.Header{"X-Checksum": {"abc123"}, "X-Count": {"1", "2"}}
				if !headerEqual(rec.Trailer, want) || !headerEqual(replay.trailer, want) {
					t.Errorf("record trailer %v, replay trailer %v, want %v", rec.Trailer, replay.trailer, want)
				}
			},
		},
		{
			name: "TrailerPrefix trailers after a flushed body",
			handler: func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "body")
				w.(http.Flusher).Flush()
				w.Header().Set(http.TrailerPrefix+"X-Late", "late value")
			},
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				want := http.Header{"X-Late": {"late value"}}
				if !headerEqual(rec.Trailer, want) || !headerEqual(replay.trailer, want) {
					t.Errorf("record trailer %v, replay trailer %v, want %v", rec.Trailer, replay.trailer, want)
				}
			},
		},
		{
			name: "documented: TrailerPrefix trailers of a short body",
			handler: func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "body")
				w.Header().Set(http.TrailerPrefix+"X-Late", "late value")
			},
			replayDiffers: true,
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				// net/http sends the short body with a Content-Length and
				// drops the trailer; the record keeps it and a replay sends it.
				if capt.trailer != nil || capt.contentLength != 4 {
					t.Errorf("captured: trailer %v, Content-Length %d", capt.trailer, capt.contentLength)
				}
				want := http.Header{"X-Late": {"late value"}}
				if !headerEqual(rec.Trailer, want) || !headerEqual(replay.trailer, want) {
					t.Errorf("record trailer %v, replay trailer %v, want %v", rec.Trailer, replay.trailer, want)
				}
				capt.trailer = replay.trailer
				compare(t, "captured/replayed except the trailer", capt, replay, false)
			},
		},
		{
			name: "both kinds of trailers",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Trailer", "X-Declared, Content-Type") // Content-Type is not a valid trailer
				io.WriteString(w, "body")
				w.Header().Set("X-Declared", "d")
				w.Header().Set(http.TrailerPrefix+"X-Prefixed", "p")
			},
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				want := http.Header{"X-Declared": {"d"}, "X-Prefixed": {"p"}}
				if !headerEqual(rec.Trailer, want) {
					t.Errorf("record trailer %v, want %v", rec.Trailer, want)
				}
			},
		},
		{
			name: "103 Early Hints then 200",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Add("Link", "</style.css>; rel=preload; as=style")
				w.WriteHeader(http.StatusEarlyHints)
				w.Header().Set("Content-Type", "text/plain")
				io.WriteString(w, "after hints")
			},
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				for _, r := range []received{plain, capt} {
					if len(r.informational) != 1 || r.informational[0].code != 103 ||
						r.informational[0].header.Get("Link") != "</style.css>; rel=preload; as=style" {
						t.Errorf("informational responses %v, want one 103 with the Link", r.informational)
					}
				}
				if len(replay.informational) != 0 {
					t.Errorf("a replay repeated informational responses: %v", replay.informational)
				}
				if rec.Status != 200 {
					t.Errorf("recorded status %d, want 200", rec.Status)
				}
			},
		},
		{
			name: "204 then Write",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Id", "7")
				w.WriteHeader(http.StatusNoContent)
				n, err := w.Write([]byte("not allowed"))
				if n != 0 || !errors.Is(err, http.ErrBodyNotAllowed) {
					t.Errorf("Write after 204 = %d, %v; want 0, ErrBodyNotAllowed", n, err)
				}
			},
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				if rec.Status != 204 || len(rec.Body) != 0 {
					t.Errorf("record %d with %d body bytes", rec.Status, len(rec.Body))
				}
				if _, ok := rec.Header["Content-Type"]; ok {
					t.Errorf("a 204 recorded a Content-Type key: %v", rec.Header)
				}
			},
		},
		{
			name: "binary body and multi-valued headers",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header()["X-Multi"] = []string{"a", "b", "c"}
				w.Header().Add("Set-Cookie", "a=1")
				w.Header().Add("Set-Cookie", "b=2")
				w.Header().Add("Cache-Control", "no-store")
				w.Write(binary256)
			},
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				if !bytes.Equal(rec.Body, binary256) || rec.Header.Get("Content-Type") != "application/octet-stream" {
					t.Errorf("record %q %x", rec.Header.Get("Content-Type"), rec.Body)
				}
				if !slices.Equal(replay.header["X-Multi"], []string{"a", "b", "c"}) {
					t.Errorf("replayed X-Multi %q", replay.header["X-Multi"])
				}
			},
		},
		{
			name:    "empty handler",
			handler: func(w http.ResponseWriter, r *http.Request) {},
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				if rec.Status != 200 || len(rec.Body) != 0 {
					t.Errorf("record %d with %d body bytes", rec.Status, len(rec.Body))
				}
				if replay.contentLength != 0 {
					t.Errorf("replay Content-Length %d", replay.contentLength)
				}
			},
		},
		{
			name: "Flush before any write",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.(http.Flusher).Flush()
				w.Write(htmlPage)
			},
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				// The status went out before any body, so net/http sent no
				// Content-Type, and a replay must not sniff one either.
				if _, ok := plain.header["Content-Type"]; ok {
					t.Errorf("net/http sent a Content-Type: %v", plain.header)
				}
				if vv, ok := rec.Header["Content-Type"]; !ok || len(vv) != 0 {
					t.Errorf("record Content-Type %q (present %v), want a key with no values", vv, ok)
				}
			},
		},
		{
			name: "Content-Encoding without Content-Type",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Encoding", "gzip")
				w.Write(gz)
			},
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				if _, ok := replay.header["Content-Type"]; ok {
					t.Errorf("replay sniffed a Content-Type: %v", replay.header)
				}
			},
		},
		{
			name: "WriteString",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.(io.StringWriter).WriteString(string(htmlPage))
			},
		},
		{
			name: "explicit Content-Type and Content-Length",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Content-Length", "2")
				io.WriteString(w, "{}")
			},
		},
		{
			name: "304 with validators",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("ETag", `"v1"`)
				w.Header().Set("Content-Type", "text/plain") // net/http drops it from a 304
				w.WriteHeader(http.StatusNotModified)
			},
		},
		{
			name: "second WriteHeader is ignored",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusAccepted)
				w.WriteHeader(http.StatusInternalServerError)
				io.WriteString(w, "accepted")
			},
		},
		{
			name:  "body over the limit",
			limit: 1000,
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Write(pdfData)
			},
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				if !bytes.Equal(capt.body, pdfData) {
					t.Errorf("the client got %d bytes, want all %d", len(capt.body), len(pdfData))
				}
			},
		},
		{
			name: "documented: first Write too short to sniff",
			handler: func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "<ht")
				io.WriteString(w, "ml><body>split</body></html>")
			},
			differs: true,
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				if got := plain.header.Get("Content-Type"); got != "text/html; charset=utf-8" {
					t.Errorf("net/http sniffed %q", got)
				}
				if got := capt.header.Get("Content-Type"); got != "text/plain; charset=utf-8" {
					t.Errorf("captured Content-Type %q", got)
				}
				compare(t, "captured/replayed", capt, replay, false)
			},
		},
		{
			name: "documented: header edited after WriteHeader",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				w.WriteHeader(http.StatusAccepted)
				w.Header().Set("X-Late", "1")
				io.WriteString(w, "accepted")
			},
			differs: true,
			check: func(t *testing.T, plain, capt, replay received, rec Record) {
				if plain.header.Get("X-Late") != "" || capt.header.Get("X-Late") != "1" || rec.Header.Get("X-Late") != "1" {
					t.Errorf("X-Late: net/http %q, captured %q, recorded %q",
						plain.header.Get("X-Late"), capt.header.Get("X-Late"), rec.Header.Get("X-Late"))
				}
				compare(t, "captured/replayed", capt, replay, false)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limit := tt.limit
			if limit == 0 {
				limit = 64 << 10
			}
			tr := newTrio(t, limit, nil, tt.handler)
			plain := fetch(t, tr.srv.URL+"/plain")
			capt := fetch(t, tr.srv.URL+"/capture")
			rec, c := tr.record(t)
			if capt.header.Get(ReplayedHeader) != "" {
				t.Errorf("the original response carries %s", ReplayedHeader)
			}
			if !tt.differs {
				compare(t, "unwrapped/captured", plain, capt, !tt.framingDiffers)
			}
			if rec.NotReplayable {
				if !c.Overflowed() {
					t.Errorf("not replayable without overflow")
				}
				if rec.Status != capt.status || len(rec.Header) != 0 || len(rec.Body) != 0 || len(rec.Trailer) != 0 {
					t.Errorf("not-replayable record %+v", rec)
				}
				rr := httptest.NewRecorder()
				if err := Replay(rr, &rec); !errors.Is(err, ErrNotReplayable) {
					t.Errorf("Replay = %v, want ErrNotReplayable", err)
				}
				if len(rr.Header()) != 0 || rr.Body.Len() != 0 || rr.Flushed {
					t.Errorf("Replay of a not-replayable record wrote something")
				}
				if tt.check != nil {
					tt.check(t, plain, capt, received{}, rec)
				}
				return
			}
			if c.Overflowed() {
				t.Error("replayable record but Overflowed")
			}
			replay := fetch(t, tr.srv.URL+"/replay")
			if replay.header.Get(ReplayedHeader) != "true" {
				t.Errorf("replay %s = %q", ReplayedHeader, replay.header.Get(ReplayedHeader))
			}
			if !tt.replayDiffers {
				compare(t, "captured/replayed", capt, replay, false)
			}
			if !bytes.Equal(rec.Body, capt.body) {
				t.Errorf("the record's body differs from what the client received")
			}
			if tt.check != nil {
				tt.check(t, plain, capt, replay, rec)
			}
		})
	}
}

// TestWriteHeaderInvalidCode checks that invalid codes panic exactly as they do
// without the capture, and are not recorded.
func TestWriteHeaderInvalidCode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		first int // a WriteHeader before the invalid one, 0 for none
		code  int
	}{
		{"1000", 0, 1000},
		{"99", 0, 99},
		{"0", 0, 0},
		{"negative", 0, -200},
		{"1000 after 200", 200, 1000}, // net/http ignores it: the status is already written
		{"1000 after 103", 103, 1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			panics := map[string]any{}
			var capt *Capture
			handler := func(path string) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					var c *Capture
					if path == "capture" {
						c = NewCapture(w, 1024, nil)
						w = c
					}
					defer func() {
						p := recover()
						mu.Lock()
						panics[path] = p
						if c != nil {
							capt = c
							// A handler that recovers goes on normally.
							defer c.Finish()
						}
						mu.Unlock()
					}()
					if tt.first != 0 {
						w.WriteHeader(tt.first)
					}
					w.WriteHeader(tt.code)
				}
			}
			mux := http.NewServeMux()
			mux.Handle("/plain", handler("plain"))
			mux.Handle("/capture", handler("capture"))
			srv := newServer(t, mux)
			plain := fetch(t, srv.URL+"/plain")
			got := fetch(t, srv.URL+"/capture")
			mu.Lock()
			defer mu.Unlock()
			if !reflect.DeepEqual(panics["plain"], panics["capture"]) {
				t.Errorf("panic %v, want %v (as without the capture)", panics["capture"], panics["plain"])
			}
			if tt.first < 200 && panics["plain"] == nil {
				t.Errorf("net/http did not panic on WriteHeader(%d)", tt.code)
			}
			if want := tt.first; want >= 200 && capt.Status() != want {
				t.Errorf("Status %d, want %d", capt.Status(), want)
			}
			compare(t, "unwrapped/captured", plain, got, true)
		})
	}
}
