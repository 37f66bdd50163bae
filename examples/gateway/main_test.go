package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/storage/memstore"
)

// TestGateway: a keyed POST reaches the upstream once, its retry is
// replayed by the gateway, a request without key and a GET pass through,
// and an upstream failure (502) is not stored.
func TestGateway(t *testing.T) {
	up := httptest.NewServer(countingUpstream())
	defer up.Close()
	target, _ := url.Parse(up.URL)
	store := memstore.New()
	defer store.Close()
	h, _, err := newGateway(store, target)
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(h)
	defer gw.Close()

	send := func(method, base, key string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+"/orders", strings.NewReader(`{"item":"book"}`))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, res.Header.Get("Idempotent-Replayed"), string(b)
	}
	want := func(gotStatus int, gotReplayed, gotBody string, status int, replayed, body string) {
		t.Helper()
		if gotStatus != status || gotReplayed != replayed || gotBody != body {
			t.Fatalf("got %d replayed=%q %q, want %d replayed=%q %q", gotStatus, gotReplayed, gotBody, status, replayed, body)
		}
	}
	first := `{"upstream_requests":1,"path":"/orders"}` + "\n"
	s, r, b := send("POST", gw.URL, "k1")
	want(s, r, b, 201, "", first)
	s, r, b = send("POST", gw.URL, "k1")
	want(s, r, b, 201, "true", first)
	s, r, b = send("POST", gw.URL, "")
	want(s, r, b, 201, "", `{"upstream_requests":2,"path":"/orders"}`+"\n")
	s, r, b = send("GET", gw.URL, "k1")
	want(s, r, b, 201, "", `{"upstream_requests":3,"path":"/orders"}`+"\n")

	// The upstream goes away: 502, released, and the retry reaches the
	// upstream again once it is back.
	up.Close()
	if s, _, _ := send("POST", gw.URL, "k2"); s != http.StatusBadGateway {
		t.Fatalf("upstream down: %d, want 502", s)
	}
	up2 := httptest.NewServer(countingUpstream())
	defer up2.Close()
	target2, _ := url.Parse(up2.URL)
	h2, _, err := newGateway(store, target2) // same store, new upstream address
	if err != nil {
		t.Fatal(err)
	}
	gw2 := httptest.NewServer(h2)
	defer gw2.Close()
	s, r, b = send("POST", gw2.URL, "k2")
	want(s, r, b, 201, "", first)
}

// A proxied request whose outcome is unknown reaches the upstream once.
// The client gives up while the upstream works (its answer is lost), or
// goes away while the upstream's answer is copied to it: either way its
// retry gets 409 from the gateway, and the upstream is not called a second
// time. On the main before this fix the first case answered 502 (a 5xx,
// released) and the second panicked after the 201 went out (a panic,
// released): both retries ran the upstream again.
func TestGatewayUnknownOutcomeNotResent(t *testing.T) {
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
			h, m, err := newGateway(store, target)
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
// the key as the client's promise that a resend is safe): behind the
// gateway the upstream would get it twice. The gateway sends such a
// request once: the upstream that closed the connection is called once,
// the client gets 502, and its retry 409. On the main before this fix the
// upstream got the request twice.
func TestGatewayBodilessRequestSentOnce(t *testing.T) {
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
	h, m, err := newGateway(store, target)
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
