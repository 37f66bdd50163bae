package nethttp_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
)

// newProxy returns a reverse proxy to target through ProxyTransport,
// protected by a middleware on store, and the middleware.
func newProxy(store storage.Store, target *url.URL) (http.Handler, *idem.Middleware, error) {
	m, err := idem.New(store, idem.WithScope(idem.AuthorizationScope))
	if err != nil {
		return nil, nil, err
	}
	proxy := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport: nethttp.ProxyTransport(nil),
	}
	return nethttp.Middleware(m)(proxy), m, nil
}

// An upstream that cannot be reached got nothing: the proxy's 502 releases
// the key, and the retry reaches the upstream once it is there.
func TestProxyUnreachableReleased(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: the dial is refused
	target, _ := url.Parse("http://" + addr)
	store := memstore.New()
	defer store.Close()
	h, m, err := newProxy(store, target)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown(context.Background())
	gw := httptest.NewServer(h)
	defer gw.Close()
	send := func() int {
		t.Helper()
		req, _ := http.NewRequest("POST", gw.URL+"/orders", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k-refused")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	if s := send(); s != http.StatusBadGateway {
		t.Fatalf("first: %d, want 502", s)
	}
	var calls atomic.Int64
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
	})}
	go up.Serve(ln)
	defer up.Close()
	if s := send(); s != http.StatusCreated || calls.Load() != 1 {
		t.Fatalf("retry: %d, upstream called %d times; want 201 and once", s, calls.Load())
	}
}

// A proxied request whose outcome is unknown reaches the upstream once.
// The client gives up while the upstream works (its answer is lost), or
// goes away while the upstream's answer is copied to it: either way its
// retry gets 409 from the proxy, and the upstream is not called a second
// time.
func TestProxyUnknownOutcomeNotResent(t *testing.T) {
	for _, c := range []struct {
		name    string
		midBody bool // the upstream's 201 went out before the client left
	}{
		{"client gives up while the upstream works", false},
		{"client goes away mid-body", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var calls atomic.Int64
			arrived := make(chan struct{}, 1)
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.ReadAll(r.Body) // net/http sees the connection close only once the body is read
				if calls.Add(1) > 1 {
					w.WriteHeader(http.StatusCreated)
					io.WriteString(w, "order 2\n")
					return
				}
				if c.midBody {
					w.WriteHeader(http.StatusCreated)
					io.WriteString(w, "order 1, part 1\n")
					w.(http.Flusher).Flush()
				}
				arrived <- struct{}{}
				// The order is placed; the answer is held until the
				// gateway has given up on this call (the client left).
				<-r.Context().Done()
				if !c.midBody {
					w.WriteHeader(http.StatusCreated)
				}
				io.WriteString(w, "order 1\n")
			}))
			defer up.Close()
			target, _ := url.Parse(up.URL)
			store := memstore.New()
			defer store.Close()
			h, m, err := newProxy(store, target)
			if err != nil {
				t.Fatal(err)
			}
			gw := httptest.NewServer(h)
			defer gw.Close()

			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, "POST", gw.URL+"/orders", strings.NewReader(`{"item":"book"}`))
			req.Header.Set("Idempotency-Key", "k-unknown")
			first := make(chan error, 1)
			go func() {
				res, err := http.DefaultClient.Do(req)
				if err == nil {
					_, err = io.ReadAll(res.Body) // ends when the client cancels
					res.Body.Close()
				}
				first <- err
			}()
			<-arrived
			cancel() // the client's timeout
			<-first
			// The first execution ends (502 or the proxy's panic) once its
			// upstream call has: Shutdown waits for it and its record.
			if err := m.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			retry, _ := http.NewRequest("POST", gw.URL+"/orders", strings.NewReader(`{"item":"book"}`))
			retry.Header.Set("Idempotency-Key", "k-unknown")
			res, err := http.DefaultClient.Do(retry)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusConflict || calls.Load() != 1 {
				t.Fatalf("retry: %d %s; the upstream was called %d times, want 409 and once", res.StatusCode, b, calls.Load())
			}
		})
	}
}

// Go's transport resends a bodiless request that carries Idempotency-Key
// by itself when a reused connection closes before the answer (it takes
// the key as the client's promise that a resend is safe): behind a
// proxy the upstream would get it twice. ProxyTransport sends such a
// request once: the upstream that closed the connection is called once,
// the client gets 502, and its retry 409.
func TestProxyBodilessRequestSentOnce(t *testing.T) {
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "" {
			w.WriteHeader(http.StatusOK) // warms a keep-alive connection
			return
		}
		calls.Add(1)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close() // the request was read (and acted on); the answer is lost
		}
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	store := memstore.New()
	defer store.Close()
	h, m, err := newProxy(store, target)
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(h)
	defer gw.Close()
	send := func(key string) int {
		t.Helper()
		req, _ := http.NewRequest("POST", gw.URL+"/orders/7/cancel", nil)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	if s := send(""); s != http.StatusOK {
		t.Fatalf("warm-up: %d", s)
	}
	if s := send("k-cancel"); s != http.StatusBadGateway {
		t.Fatalf("first: %d, want 502", s)
	}
	if err := m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := send("k-cancel"); s != http.StatusConflict || calls.Load() != 1 {
		t.Fatalf("retry: %d; the upstream got the request %d times, want 409 and once", s, calls.Load())
	}
}
