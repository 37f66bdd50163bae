package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/storage"
)

type scenario struct {
	name string
	run  func(t *testing.T, s *suite)
}

var scenarios = []scenario{
	{"ReplayFidelity", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/orders", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			h.Set("Content-Type", "application/json")
			h.Add("X-Multi", "one")
			h.Add("X-Multi", "two")
			h.Set("Location", "/orders/42")
			h.Set("Set-Cookie", "session=secret")
			h.Set("Trailer", "X-Checksum")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"id":42}`)
			h.Set("X-Checksum", "abc")
		})}})
		orig := e.post("/orders", "k1", `{"item":"book"}`)
		if orig.status != 201 || string(orig.body) != `{"id":42}` || orig.trailer.Get("X-Checksum") != "abc" {
			t.Fatalf("original: %v trailer %v", orig, orig.trailer)
		}
		if orig.header.Get("Set-Cookie") == "" {
			t.Fatal("original lost its Set-Cookie")
		}
		for range 3 {
			replay := e.post("/orders", "k1", `{"item":"book"}`)
			sameResponse(t, orig, replay)
			if replay.header.Get("Set-Cookie") != "" {
				t.Fatal("Set-Cookie was replayed; it is omitted by default")
			}
		}
		c.want(t, 1)
		if got := e.ev.outcomes(); len(got) != 4 || got[0] != idem.Executed || got[3] != idem.Replayed {
			t.Fatalf("events %v", got)
		}
	}},
	{"SniffedContentType", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/page", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "<!DOCTYPE html><html><body>ok</body></html>")
		})}})
		orig := e.post("/page", "k", "")
		if ct := orig.header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
			t.Fatalf("original Content-Type %q", ct)
		}
		sameResponse(t, orig, e.post("/page", "k", ""))
		c.want(t, 1)
	}},
	{"BinaryBody", func(t *testing.T, s *suite) {
		body := make([]byte, 3000)
		for i := range body {
			body[i] = byte(i * 7)
		}
		body[0], body[1] = 0, 0
		var c counter
		e := s.env([]Route{{"POST", "/bin", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header()["X-Values"] = []string{"a", "b", "c"}
			w.Write(body[:1000])
			w.Write(body[1000:])
		})}})
		orig := e.post("/bin", "k", "")
		if !bytes.Equal(orig.body, body) {
			t.Fatal("original body differs")
		}
		sameResponse(t, orig, e.post("/bin", "k", ""))
		c.want(t, 1)
	}},
	{"RequestBodyUnchanged", func(t *testing.T, s *suite) {
		var c counter
		infos := make(chan idem.Info, 1)
		leases := make(chan storage.Lease, 1)
		e := s.env([]Route{{"POST", "/echo", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			info, _ := idem.FromContext(r.Context())
			infos <- info
			lease, _ := storage.LeaseFromContext(r.Context())
			leases <- lease
			b, _ := io.ReadAll(r.Body)
			w.Write(b)
		})}})
		body := strings.Repeat("payload-", 5000)
		r := e.do(req{path: "/echo", key: `"quoted \"key\""`, body: body, chunked: true})
		if r.status != 200 || string(r.body) != body {
			t.Fatalf("handler saw a different body: %d bytes", len(r.body))
		}
		info := <-infos
		if !info.Protected || info.Key != `quoted "key"` || !ownerRE.MatchString(info.Owner) || len(info.StorageKey) != 22 {
			t.Fatalf("FromContext = %+v", info)
		}
		if lease := <-leases; lease != (storage.Lease{Key: info.StorageKey, Owner: info.Owner, TTL: idem.DefaultTTL}) {
			t.Fatalf("storage.LeaseFromContext = %+v, want the Info's storage key and owner and the TTL", lease)
		}
		sameResponse(t, r, e.do(req{path: "/echo", key: `"quoted \"key\""`, body: body}))
		c.want(t, 1)
	}},
	{"BareAndQuotedKeySame", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "x") })}})
		e.post("/o", "abc", "")
		if r := e.post("/o", `"abc"`, ""); r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("quoted form of the same key was not replayed: %v", r)
		}
		c.want(t, 1)
	}},
	{"ConcurrentDuplicates", func(t *testing.T, s *suite) {
		const n = 50
		var c counter
		g := newGate()
		defer g.release()
		e := s.env([]Route{{"POST", "/pay", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			if c.n.Load() > 1 {
				// A second execution: answer at once, so the test fails
				// on it instead of waiting for a gate nobody opens.
				w.WriteHeader(http.StatusTeapot)
				return
			}
			g.wait()
			w.WriteHeader(201)
			io.WriteString(w, "charged")
		})}})
		replies := make(chan reply, n)
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				replies <- e.post("/pay", "dup", "amount=10")
			}()
		}
		// Every request but the one inside the handler answers while the
		// handler is blocked: they must all be conflicts.
		for range n - 1 {
			r := <-replies
			problem(t, r, http.StatusConflict, idem.ErrConflict)
			retryAfter(t, r)
		}
		<-g.entered
		g.release()
		wg.Wait()
		if r := <-replies; r.status != 201 || string(r.body) != "charged" {
			t.Fatalf("the executing request got %v", r)
		}
		c.want(t, 1)
		if r := e.post("/pay", "dup", "amount=10"); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry after completion: %v", r)
		}
	}},
	{"WaitForInFlight", func(t *testing.T, s *suite) {
		var c counter
		g := newGate()
		defer g.release()
		e := s.env([]Route{{"POST", "/slow", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			g.wait()
			io.WriteString(w, "done")
		})}}, idem.WithWait(20*time.Second))
		first := make(chan reply, 1)
		go func() { first <- e.post("/slow", "w", "") }()
		<-g.entered
		<-e.spy.acquired // the first request's acquire
		second := make(chan reply, 1)
		go func() { second <- e.post("/slow", "w", "") }()
		<-e.spy.acquired // the duplicate found it in flight and waits
		g.release()
		if r := <-first; r.status != 200 {
			t.Fatalf("first: %v", r)
		}
		r := <-second
		if r.status != 200 || string(r.body) != "done" || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("waiting duplicate got %v", r)
		}
		c.want(t, 1)
	}},
	{"DifferentRequestSameKey", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/orders", c.wrap(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) })}})
		e.post("/orders", "k", `{"amount":10}`)
		problem(t, e.post("/orders", "k", `{"amount":99}`), 422, idem.ErrMismatch)
		problem(t, e.do(req{path: "/orders", key: "k", body: `{"amount":10}`, header: http.Header{"Content-Type": {"text/plain"}}}), 422, idem.ErrMismatch)
		problem(t, e.post("/orders?x=1", "k", `{"amount":10}`), 422, idem.ErrMismatch)
		c.want(t, 1)
		if e.ev.last().Outcome != idem.Mismatch {
			t.Fatalf("last event %v", e.ev.last())
		}
	}},
	{"InvalidKeys", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) {})}})
		for name, lines := range map[string][]string{
			"empty quoted": {`Idempotency-Key: ""`},
			"too long":     {"Idempotency-Key: " + strings.Repeat("k", 256)},
			"non-ASCII":    {"Idempotency-Key: cl\xc3\xa9"},
			"unterminated": {`Idempotency-Key: "abc`},
			"bad escape":   {`Idempotency-Key: "a\b"`},
			"two headers":  {"Idempotency-Key: a", "Idempotency-Key: b"},
			"tab inside":   {"Idempotency-Key: a\tb"}, // net/http itself refuses other control bytes
			"inner quote":  {`Idempotency-Key: "a"b"`},
			"quoted > 255": {`Idempotency-Key: "` + strings.Repeat("k", 256) + `"`},
			"empty":        {"Idempotency-Key: "},
		} {
			t.Run(name, func(t *testing.T) { problem(t, e.raw("POST", "/o", lines...), 400, idem.ErrInvalidKey) })
		}
		if got := e.do(req{path: "/o", key: strings.Repeat("k", 255)}); got.status != 200 {
			t.Fatalf("255-byte key refused: %v", got)
		}
		if e.spy.acquires.Load() != 1 {
			t.Fatalf("invalid keys reached the store: %d acquires", e.spy.acquires.Load())
		}
	}},
	{"RequireKey", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) {})}}, idem.WithRequireKey())
		problem(t, e.post("/o", "", "x"), 400, idem.ErrMissingKey)
		c.want(t, 0)
	}},
	{"NoKeyPassesThrough", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			if _, ok := idem.FromContext(r.Context()); ok {
				t.Error("FromContext reports protection for a request without key")
			}
		})}})
		e.post("/o", "", "x")
		e.post("/o", "", "x")
		c.want(t, 2)
		if e.spy.acquires.Load() != 0 || len(e.ev.outcomes()) != 0 {
			t.Fatal("a request without key touched the store or the observer")
		}
	}},
	{"SafeMethodsPassThrough", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"GET", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "list") })},
			{"PUT", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) {})}})
		for range 2 {
			if r := e.do(req{method: "GET", path: "/o", key: "k"}); r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("GET: %v", r)
			}
			e.do(req{method: "PUT", path: "/o", key: "k"})
		}
		c.want(t, 4)
		if e.spy.acquires.Load() != 0 {
			t.Fatal("an unprotected method reached the store")
		}
	}},
	{"ServerErrorReleases", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			if c.n.Load() == 1 {
				http.Error(w, "db down", http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(201)
		})}})
		if r := e.post("/o", "k", ""); r.status != 503 {
			t.Fatalf("first: %v", r)
		}
		if r := e.post("/o", "k", ""); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("retry after 503 did not run the handler: %v", r)
		}
		if r := e.post("/o", "k", ""); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("third: %v", r)
		}
		c.want(t, 2)
		if got := e.ev.outcomes(); got[0] != idem.Released || got[1] != idem.Executed {
			t.Fatalf("events %v", got)
		}
	}},
	{"PanicReleases", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			if c.n.Load() == 1 {
				panic("boom")
			}
			w.WriteHeader(201)
		})}})
		if r := e.post("/o", "k", ""); r.status != 500 {
			t.Fatalf("panicking handler: %v (the framework's recovery answers 500)", r)
		}
		if r := e.post("/o", "k", ""); r.status != 201 {
			t.Fatalf("retry after panic: %v", r)
		}
		c.want(t, 2)
		if ev := e.ev.first(); ev.Outcome != idem.Released || ev.Err == nil {
			t.Fatalf("panic event %+v", ev)
		}
	}},
	{"LargeResponseNotReplayable", func(t *testing.T, s *suite) {
		var c counter
		big := bytes.Repeat([]byte("0123456789abcdef"), 1024)
		e := s.env([]Route{{"POST", "/export", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/csv")
			w.Write(big)
		})}}, idem.WithMaxResponseBody(4096))
		if r := e.post("/export", "k", ""); r.status != 200 || !bytes.Equal(r.body, big) {
			t.Fatalf("first client did not get the whole response: %d bytes", len(r.body))
		}
		r := e.post("/export", "k", "")
		problem(t, r, 409, idem.ErrNotReplayable)
		if !strings.Contains(string(r.body), "200") {
			t.Fatalf("detail does not name the original status: %s", r.body)
		}
		c.want(t, 1)
		if got := e.ev.outcomes(); got[0] != idem.NotReplayable || got[1] != idem.Conflict {
			t.Fatalf("events %v", got)
		}
	}},
	{"RequestBodyTooLarge", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/up", c.wrap(func(w http.ResponseWriter, r *http.Request) {})}}, idem.WithMaxRequestBody(1000))
		problem(t, e.post("/up", "k", strings.Repeat("x", 1001)), 413, idem.ErrBodyTooLarge)
		problem(t, e.do(req{path: "/up", key: "k2", body: strings.Repeat("x", 5000), chunked: true}), 413, idem.ErrBodyTooLarge)
		if r := e.post("/up", "k3", strings.Repeat("x", 1000)); r.status != 200 {
			t.Fatalf("body at the limit: %v", r)
		}
		c.want(t, 1)
		if e.spy.acquires.Load() != 1 {
			t.Fatal("an oversized request reached the store")
		}
	}},
	{"Flush", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/stream", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			rc := http.NewResponseController(w)
			for i := range 3 {
				fmt.Fprintf(w, "data: %d\n\n", i)
				if err := rc.Flush(); err != nil {
					t.Errorf("Flush: %v", err)
				}
			}
			w.(http.Flusher).Flush()
		})}})
		orig := e.post("/stream", "k", "")
		if string(orig.body) != "data: 0\n\ndata: 1\n\ndata: 2\n\n" {
			t.Fatalf("streamed body %q", orig.body)
		}
		sameResponse(t, orig, e.post("/stream", "k", ""))
		c.want(t, 1)
	}},
	{"StoreDown", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) {})}})
		e.spy.down.Store(true)
		r := e.post("/o", "k", "")
		problem(t, r, 503, idem.ErrStoreUnavailable)
		retryAfter(t, r)
		c.want(t, 0)
		if ev := e.ev.last(); ev.Outcome != idem.StoreError || !errors.Is(ev.Err, errDown) {
			t.Fatalf("event %+v", ev)
		}
		e.spy.down.Store(false)
		if r := e.post("/o", "k", ""); r.status != 200 {
			t.Fatalf("after recovery: %v", r)
		}
		c.want(t, 1)
	}},
	{"StoreDownFailOpen", func(t *testing.T, s *suite) {
		var c counter
		infos := make(chan idem.Info, 1)
		leased := make(chan bool, 1)
		e := s.env([]Route{{"POST", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			info, _ := idem.FromContext(r.Context())
			infos <- info
			_, ok := storage.LeaseFromContext(r.Context())
			leased <- ok
			b, _ := io.ReadAll(r.Body)
			w.Write(b)
		})}}, idem.WithFailOpen())
		e.spy.down.Store(true)
		if r := e.post("/o", "k", "body"); r.status != 200 || string(r.body) != "body" {
			t.Fatalf("fail-open: %v", r)
		}
		c.want(t, 1)
		if info := <-infos; info.Protected || info.Key != "k" || info.StorageKey != "" || <-leased {
			t.Fatalf("FromContext under fail-open = %+v, or a storage.Lease in the context", info)
		}
		if e.ev.last().Outcome != idem.FailedOpen {
			t.Fatalf("event %+v", e.ev.last())
		}
	}},
	{"RouteScoping", func(t *testing.T, s *suite) {
		var a, b counter
		e := s.env([]Route{
			{"POST", "/a", a.wrap(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "a") })},
			{"POST", "/b", b.wrap(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "b") })},
			{"POST", "/items/{id}", b.wrap(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.URL.Path) })},
		}, idem.WithoutFingerprint())
		if r := e.post("/a", "k", ""); string(r.body) != "a" {
			t.Fatalf("/a: %v", r)
		}
		if r := e.post("/b", "k", ""); string(r.body) != "b" || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("/b shared /a's record: %v", r)
		}
		// One route pattern is one scope: without a fingerprint the key
		// alone decides, even across paths of the same pattern.
		e.post("/items/1", "k2", "")
		if r := e.post("/items/2", "k2", ""); string(r.body) != "/items/1" || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("same pattern, other path: %v", r)
		}
		a.want(t, 1)
		b.want(t, 2)
	}},
	// The default scope is the principal that the authentication names
	// (here "Bearer alice" and "Bearer alice.2", her refreshed token, are
	// alice's): a retry with a refreshed token is a replay, and another
	// principal never gets alice's record.
	{"PrincipalScoping", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			p, _ := idem.PrincipalFromContext(r.Context())
			io.WriteString(w, p)
		})}})
		alice := http.Header{"Authorization": {"Bearer alice"}}
		refreshed := http.Header{"Authorization": {"Bearer alice.2"}}
		bob := http.Header{"Authorization": {"Bearer bob"}}
		e.do(req{path: "/o", key: "k", header: alice})
		if r := e.do(req{path: "/o", key: "k", header: refreshed}); string(r.body) != "alice" || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("alice's retry with a refreshed token: %v", r)
		}
		if r := e.do(req{path: "/o", key: "k", header: bob}); string(r.body) != "bob" || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("bob got alice's record: %v", r)
		}
		if r := e.do(req{path: "/o", key: "k", header: alice}); string(r.body) != "alice" || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("alice's retry: %v", r)
		}
		c.want(t, 2)
	}},
	// Credentials that the authentication did not turn into a principal,
	// under the default scope: 500 ErrScopeUnknown before the store is
	// asked or the handler runs; the observer is told. Without credentials
	// the request is anonymous.
	{"ScopeUnknownRefused", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) {})}})
		r := e.do(req{path: "/o", key: "k", header: http.Header{"Authorization": {"Token raw-api-key"}}})
		problem(t, r, 500, idem.ErrScopeUnknown)
		if r.header.Get("Retry-After") != "" {
			t.Fatalf("Retry-After %q on a misconfiguration", r.header.Get("Retry-After"))
		}
		if e.spy.acquires.Load() != 0 {
			t.Fatal("the refused request reached the store")
		}
		if ev := e.ev.last(); ev.Outcome != idem.Rejected || ev.Status != 500 || !errors.Is(ev.Err, idem.ErrScopeUnknown) {
			t.Fatalf("event %+v", ev)
		}
		c.want(t, 0)
		e.do(req{path: "/o", key: "k"})
		c.want(t, 1)
	}},
	{"UnmatchedRouteNotStored", func(t *testing.T, s *suite) {
		e := s.env([]Route{{"POST", "/o", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})}})
		for range 2 {
			if r := e.post("/nope", "k", ""); r.status != 404 || r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("unmatched route: %v", r)
			}
		}
		if e.spy.acquires.Load() != 0 {
			t.Fatal("an unmatched route reached the store")
		}
	}},
	{"LeaseLost", func(t *testing.T, s *suite) {
		var c counter
		g := newGate()
		defer g.release()
		e := s.env([]Route{{"POST", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			if c.n.Load() == 1 {
				g.wait() // the first execution stalls past its lease
				io.WriteString(w, "late")
				return
			}
			io.WriteString(w, "second")
		})}}, idem.WithLease(time.Hour))
		first := make(chan reply, 1)
		go func() { first <- e.post("/o", "k", "") }()
		<-g.entered
		e.advance(2 * time.Hour) // no renewal happened: the heartbeat is due only after 20 minutes
		if r := e.post("/o", "k", ""); string(r.body) != "second" {
			t.Fatalf("after the lease expired: %v", r)
		}
		g.release()
		if r := <-first; string(r.body) != "late" {
			t.Fatalf("late first: %v", r)
		}
		if ev := e.ev.last(); ev.Outcome != idem.LeaseLost || !errors.Is(ev.Err, idem.ErrLeaseLost) {
			t.Fatalf("late finish event %+v", ev)
		}
		if r := e.post("/o", "k", ""); string(r.body) != "second" || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("the late finish overwrote the record: %v", r)
		}
		c.want(t, 2)
	}},
	{"SlowBodyHoldsNoLease", func(t *testing.T, s *suite) {
		// A client stalls halfway through its body: the key is not locked
		// while the body is read, so the same key from another connection
		// runs at once, and the slow request, once complete, replays it.
		var c counter
		reading := make(chan struct{})
		var once sync.Once
		watch := func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-Slow") != "" {
					r.Body = &readHook{ReadCloser: r.Body, hook: func() { once.Do(func() { close(reading) }) }}
				}
				h.ServeHTTP(w, r)
			})
		}
		e := s.wrappedEnv(watch, []Route{{"POST", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "run %d: %s", c.n.Load(), b)
		})}})
		pr, pw := io.Pipe()
		defer pw.CloseWithError(errors.New("scenario over")) // before the server's Close waits for it
		slow := make(chan *http.Response, 1)
		go func() {
			r, _ := http.NewRequest("POST", e.srv.URL+"/o", pr)
			r.Header.Set("Idempotency-Key", "k")
			r.Header.Set("X-Slow", "1")
			res, err := e.srv.Client().Do(r)
			if err != nil {
				res = nil
			}
			slow <- res
		}()
		io.WriteString(pw, "first half, ")
		<-reading
		if n := e.spy.acquires.Load(); n != 0 {
			t.Fatalf("%d acquires before the body was read", n)
		}
		fast := e.post("/o", "k", "first half, second half")
		if fast.status != 200 || string(fast.body) != "run 1: first half, second half" {
			t.Fatalf("the same key while another client stalls in its body: %v, want it to run", fast)
		}
		io.WriteString(pw, "second half")
		pw.Close()
		res := <-slow
		if res == nil {
			t.Fatal("the slow request failed")
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 || !bytes.Equal(b, fast.body) || res.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("the slow request: %d %q, want the replay of %q", res.StatusCode, b, fast.body)
		}
		c.want(t, 1)
	}},
	{"HostileKeysDistinct", func(t *testing.T, s *suite) {
		// Keys made of Redis's special characters (hash tags, ':', globs),
		// spaces, and 255 bytes each get a record of their own.
		var c counter
		e := s.env([]Route{{"POST", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			info, _ := idem.FromContext(r.Context())
			io.WriteString(w, info.Key)
		})}}, idem.WithoutFingerprint())
		keys := []string{"{a}", "{a}:b", "a:{b}", "{", "}", ":", "a:b", "*", "a*", "idem:*", "conf:*", "?", "a b", " a ",
			strings.Repeat("k", 255), strings.Repeat("k", 254) + "K", strings.Repeat("{", 255), strings.Repeat("*", 255)}
		for pass := range 2 {
			for _, k := range keys {
				sent := `"` + k + `"` // the RFC 8941 form keeps the spaces that a bare value loses
				r := e.post("/o", sent, "")
				if r.status != 200 || string(r.body) != k || (r.header.Get("Idempotent-Replayed") == "true") != (pass == 1) {
					t.Fatalf("pass %d, key %q: %v", pass, k, r)
				}
			}
		}
		c.want(t, int64(len(keys)))
	}},
	{"HandlerWritesNothing", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) {})}})
		orig := e.post("/o", "k", "")
		if orig.status != 200 || len(orig.body) != 0 {
			t.Fatalf("empty handler: %v", orig)
		}
		sameResponse(t, orig, e.post("/o", "k", ""))
		c.want(t, 1)
	}},
}

// readHook calls hook before each Read.
type readHook struct {
	io.ReadCloser
	hook func()
}

func (r *readHook) Read(p []byte) (int, error) {
	r.hook()
	return r.ReadCloser.Read(p)
}
