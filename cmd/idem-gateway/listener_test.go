package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// A TLS listener offers HTTP/2 (ALPN h2) beside HTTP/1.1: a client that
// can speak it does, and a protected request over it is replayed.
func TestProcessTLSListenerHTTP2(t *testing.T) {
	up := newUpstream(t)
	cert, key, pool := selfSigned(t, t.TempDir())
	gw := startGateway(t, fmt.Sprintf(`listen: [{address: "127.0.0.1:0", tls: {cert: %q, key: %q}}]
store: {memory: {}}
upstreams: {app: {url: %q}}
routes: [{match: "/", upstream: app, scope: {none: true}}]
`, cert, key, up.URL))
	ctx := deadline(t, time.Minute)
	url := "https://" + gw.addr + "/orders"
	for _, c := range []struct {
		name  string
		major int
		tr    *http.Transport
	}{
		{"h2", 2, &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "localhost"}}},
		{"http/1.1", 1, &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{"http/1.1"}}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer c.tr.CloseIdleConnections()
			client := &http.Client{Transport: c.tr}
			req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
			res, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.ProtoMajor != c.major || res.TLS.NegotiatedProtocol != c.name {
				t.Fatalf("got %s (ALPN %q), want HTTP/%d (ALPN %q)", res.Proto, res.TLS.NegotiatedProtocol, c.major, c.name)
			}
			k := "tls-" + c.name
			first := post(ctx, client, url, k, `{}`)
			again := settled(ctx, client, url, k, `{}`)
			if first.status != http.StatusCreated || !again.replayed || again.body != first.body || up.ran(k) != 1 {
				t.Fatalf("over %s: %v then %v, the upstream ran %d times", c.name, first, again, up.ran(k))
			}
		})
	}
}
