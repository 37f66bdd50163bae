package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// An upstream that announces a trailer (Trailer: X-Checksum) and sends it
// after its body: the first answer of a protected route carries the
// trailer, as its replay does, and both are the same (chunked, since
// HTTP/1.1 has trailers only after a chunked body). Over HTTP/1.1 the
// upstream's body is chunked; over HTTP/2 (h2c) it may have a
// Content-Length as well.
func TestProcessTrailerFirstAnswer(t *testing.T) {
	for _, c := range []struct {
		name   string
		h2c    bool
		length bool // the upstream declares its body's Content-Length
	}{
		{"HTTP/1.1 chunked", false, false},
		{"h2c with Content-Length", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var calls atomic.Int64
			const body = "order 1\n"
			up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.ReadAll(r.Body)
				calls.Add(1)
				w.Header().Set("Trailer", "X-Checksum")
				w.Header().Set("Content-Type", "text/plain")
				if c.length {
					w.Header().Set("Content-Length", fmt.Sprint(len(body)))
				}
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, body)
				w.Header().Set("X-Checksum", "c0ffee")
			})}
			upstream := ""
			if c.h2c {
				var p http.Protocols
				p.SetUnencryptedHTTP2(true)
				up.Protocols = &p
				upstream = "    h2c: true\n"
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go up.Serve(ln)
			t.Cleanup(func() { up.Close() })
			gw := startGateway(t, gatewayConfig("http://"+ln.Addr().String(), "memory: {}", upstream, ""))
			ctx := deadline(t, time.Minute)

			type got struct {
				status        int
				body, trailer string
				length        int64
				replayed      bool
			}
			send := func(key string) got {
				t.Helper()
				for {
					req, _ := http.NewRequestWithContext(ctx, "POST", gw.url("/orders"), strings.NewReader(`{}`))
					if key != "" {
						req.Header.Set("Idempotency-Key", key)
					}
					res, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					b, err := io.ReadAll(res.Body) // the trailers come after the body
					res.Body.Close()
					if err != nil {
						t.Fatal(err)
					}
					if a := (answer{status: res.StatusCode, body: string(b)}); inFlight(a) && ctx.Err() == nil {
						time.Sleep(20 * time.Millisecond) // the first's record is not stored yet
						continue
					}
					return got{status: res.StatusCode, body: string(b), trailer: res.Trailer.Get("X-Checksum"),
						length: res.ContentLength, replayed: res.Header.Get("Idempotent-Replayed") == "true"}
				}
			}
			first := send("k-trailer")
			again := send("k-trailer")
			if first.status != http.StatusCreated || first.replayed || first.body != body || first.trailer != "c0ffee" {
				t.Errorf("first answer: %+v, want 201 with trailer X-Checksum: c0ffee", first)
			}
			if !again.replayed || again.status != first.status || again.body != first.body || again.trailer != first.trailer ||
				again.length != first.length {
				t.Errorf("replay: %+v, want the first answer %+v replayed", again, first)
			}
			if n := calls.Load(); n != 1 {
				t.Errorf("the upstream ran %d times, want once", n)
			}
		})
	}
}
