package nethttp_test

import (
	"bytes"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/memstore"
)

// discardLog drops what ReverseProxy and the server log.
var discardLog = log.New(io.Discard, "", 0)

// An upstream that answered and whose body then failed (cut, timed out)
// may have acted: ProxyTransport keeps the key done whatever the proxy
// then does, so the retry gets 409 and the upstream is called once. The
// proxy may fail before it sends a byte of the answer: ReverseProxy's copy
// of a body cut before its first byte (it aborts the handler with nothing
// sent), or a ModifyResponse that reads the body whole first (the proxy
// answers 502).
func TestProxyBodyReadFailsKeepsKeyDone(t *testing.T) {
	for _, c := range []struct {
		name   string
		head   string // what the upstream sends before it closes the connection
		modify func(*http.Response) error
	}{
		{"Content-Length body cut before its first byte",
			"HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n", nil},
		{"chunked body read whole by ModifyResponse, cut mid-chunk",
			"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n20\r\nhello",
			func(res *http.Response) error {
				b, err := io.ReadAll(res.Body)
				if err != nil {
					return err
				}
				res.Body = io.NopCloser(bytes.NewReader(b))
				return nil
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var calls atomic.Int64
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.ReadAll(r.Body)
				calls.Add(1)
				conn, buf, err := http.NewResponseController(w).Hijack()
				if err != nil {
					panic(err)
				}
				buf.WriteString(c.head)
				buf.Flush()
				conn.Close() // what was sent arrives before the close
			}))
			defer up.Close()
			target, _ := url.Parse(up.URL)
			store := memstore.New()
			defer store.Close()
			m, err := idem.New(store, idem.WithScope(idem.AuthorizationScope))
			if err != nil {
				t.Fatal(err)
			}
			proxy := &httputil.ReverseProxy{
				Rewrite:        func(r *httputil.ProxyRequest) { r.SetURL(target) },
				Transport:      nethttp.ProxyTransport(nil),
				ModifyResponse: c.modify,
				ErrorLog:       discardLog,
			}
			gw := httptest.NewServer(nethttp.Middleware(m)(proxy))
			gw.Config.ErrorLog = discardLog // the aborted handler's panic
			defer gw.Close()
			send := func() (int, string, error) {
				req, _ := http.NewRequest("POST", gw.URL+"/orders", strings.NewReader(`{}`))
				req.Header.Set("Idempotency-Key", "k-cut")
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					return 0, "", err
				}
				b, err := io.ReadAll(res.Body)
				res.Body.Close()
				return res.StatusCode, string(b), err
			}
			if status, _, err := send(); err == nil && status != http.StatusBadGateway {
				t.Fatalf("first: %d, want 502 or a broken connection", status)
			}
			defer m.Shutdown(context.Background())
			status, body, err := send()
			for err == nil && status == http.StatusConflict && strings.Contains(body, "#ErrConflict") {
				// The first execution's record is not stored yet.
				time.Sleep(10 * time.Millisecond)
				status, body, err = send()
			}
			if err != nil || status != http.StatusConflict || !strings.Contains(body, "#ErrNotReplayable") || calls.Load() != 1 {
				t.Fatalf("retry: %d %q %v; the upstream was called %d times, want 409 ErrNotReplayable and once", status, body, err, calls.Load())
			}
		})
	}
}
