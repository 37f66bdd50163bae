package nethttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/memstore"
)

// What the ServeMux answers itself is not the application's: its
// redirects pass through like its 404 and 405. POST /orders, when only
// POST /orders/ is registered, gets the mux's redirect to /orders/; the
// client follows it with the same key, and the handler runs; the same
// request again is redirected again, and then replayed. On the main
// before this fix the redirect was recorded as the execution and the
// follow-up got 422.
func TestMuxRedirectNotStored(t *testing.T) {
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	var mu sync.Mutex
	var events []idem.Event
	m, err := idem.New(store, idem.WithObserver(func(ev idem.Event) { mu.Lock(); events = append(events, ev); mu.Unlock() }))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders/", func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "created")
	})
	srv := httptest.NewServer(nethttp.Middleware(m)(mux))
	t.Cleanup(srv.Close)

	// The client follows the redirects itself, as a client that keeps the
	// method and body does (the mux answers 301 up to Go 1.25, 307 since
	// Go 1.26; a client turns a POST into a GET after a 301).
	client := srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for i, path := range []string{"/orders", "/x/../orders"} {
		url := srv.URL + path
		for hops := 0; ; hops++ {
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"item":"book"}`))
			req.Header.Set("Idempotency-Key", "k")
			req.Header.Set("Content-Type", "application/json")
			res, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if loc := res.Header.Get("Location"); res.StatusCode/100 == 3 && loc != "" && hops < 3 {
				if res.Header.Get("Idempotent-Replayed") != "" {
					t.Fatalf("POST %s: the mux's redirect %d was replayed", url, res.StatusCode)
				}
				url = srv.URL + loc
				continue
			}
			if res.StatusCode != http.StatusCreated || string(body) != "created" {
				t.Fatalf("POST %s, following the mux's redirects: %d %q", path, res.StatusCode, body)
			}
			if replayed := res.Header.Get("Idempotent-Replayed") == "true"; replayed != (i > 0) {
				t.Fatalf("POST %s: Idempotent-Replayed %q", path, res.Header.Get("Idempotent-Replayed"))
			}
			break
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1 (then replayed)", runs.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	for _, ev := range events {
		if ev.Route != "/orders/" {
			t.Errorf("event for route %q: the mux's redirect reached the middleware", ev.Route)
		}
	}
}

// A nil Middleware is refused when the handler is built, not at the first
// request.
func TestNilMiddlewarePanics(t *testing.T) {
	defer func() {
		if p := recover(); p == nil {
			t.Fatal("nethttp.Middleware(nil) did not panic")
		}
	}()
	nethttp.Middleware(nil)
}
