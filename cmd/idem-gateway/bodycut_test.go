package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// gatewayConfig is a one-instance gateway on the memory store (store, as
// "memory: {}") in front of upURL, with upstream's extra fields (indented
// for upstreams.app) and route's (for the one route, "/").
func gatewayConfig(upURL, store, upstream, route string) string {
	return fmt.Sprintf(`listen:
  - address: 127.0.0.1:0
admin:
  address: 127.0.0.1:0
log:
  level: debug
store:
  %s
upstreams:
  app:
    url: %s
%s
routes:
  - match: /
    upstream: app
    scope: {none: true}
%s`, store, upURL, upstream, route)
}

// notReplayable reports whether a is the 409 of a key whose execution is
// done without a stored response.
func notReplayable(a answer) bool {
	return a.err == nil && a.status == http.StatusConflict && strings.Contains(a.body, "#ErrNotReplayable")
}

// An upstream that answers 201 with a chunked body it never finishes (its
// connection closes mid-chunk), or whose body is still coming when the
// upstream's timeout passes, may have acted: the client gets 502, the key
// stays done, and its retries get 409 ErrNotReplayable, never a second
// upstream call (as with a Content-Length body cut short).
func TestProcessChunkedBodyCut(t *testing.T) {
	for _, c := range []struct {
		name     string
		upstream string // upstreams.app's extra fields
		serve    func(w http.ResponseWriter, r *http.Request)
	}{
		{
			name: "connection closed mid-chunk",
			serve: func(w http.ResponseWriter, r *http.Request) {
				conn, buf, err := http.NewResponseController(w).Hijack()
				if err != nil {
					panic(err)
				}
				// A chunk announced as 0x20 bytes of which 5 come, and the
				// connection closes: what was sent arrives before the close.
				buf.WriteString("HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n" +
					"20\r\nhello")
				buf.Flush()
				conn.Close()
			},
		},
		{
			name:     "body still coming past the upstream's timeout",
			upstream: "    timeout: 1s\n",
			serve: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "part 1\n")
				w.(http.Flusher).Flush()
				<-r.Context().Done() // the gateway gave up on the call
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var calls atomic.Int64
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.ReadAll(r.Body)
				calls.Add(1)
				c.serve(w, r)
			}))
			t.Cleanup(up.Close)
			gw := startGateway(t, gatewayConfig(up.URL, "memory: {}", c.upstream, ""))
			ctx := deadline(t, time.Minute)
			client := &http.Client{}

			first := post(ctx, client, gw.url("/orders"), "cut", `{"item":"book"}`)
			if first.err != nil || first.status != http.StatusBadGateway {
				t.Fatalf("first: %v, want 502", first)
			}
			for i := range 2 {
				if a := settled(ctx, client, gw.url("/orders"), "cut", `{"item":"book"}`); !notReplayable(a) {
					t.Fatalf("retry %d: %v, want 409 ErrNotReplayable; the upstream ran %d times", i+1, a, calls.Load())
				}
			}
			if n := calls.Load(); n != 1 {
				t.Fatalf("the upstream ran %d times, want once", n)
			}
		})
	}
}
