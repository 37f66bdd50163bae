package idem_test

// Security guarantees, each checked end to end through the net/http
// adapter: records never cross scopes, a client's key cannot address or
// collide with another record nor reach the store's key space, an
// oversized body is refused without being read, a slow body holds no
// lease, and neither error bodies nor observer events carry the
// Authorization value or the raw key.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
)

// secSpy wraps a store: it records the keys it is given, counts Acquire
// calls and can fail every call or corrupt the records it returns.
type secSpy struct {
	storage.Store
	acquires atomic.Int64
	down     atomic.Bool // every call fails with errSecDown
	corrupt  atomic.Bool // a done entry's record comes back as garbage
	mu       sync.Mutex
	keys     map[string]bool
}

var errSecDown = errors.New("store down")

func newSecSpy(s storage.Store) *secSpy { return &secSpy{Store: s, keys: map[string]bool{}} }

func (s *secSpy) Acquire(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
	s.acquires.Add(1)
	s.mu.Lock()
	s.keys[key] = true
	s.mu.Unlock()
	if s.down.Load() {
		return storage.Result{}, errSecDown
	}
	res, err := s.Store.Acquire(ctx, key, owner, fp, lease)
	if err == nil && res.State == storage.Done && s.corrupt.Load() {
		res.Record = []byte("garbage")
	}
	return res, err
}

func (s *secSpy) Complete(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
	if s.down.Load() {
		return errSecDown
	}
	return s.Store.Complete(ctx, key, owner, rec, ttl)
}

func (s *secSpy) Release(ctx context.Context, key, owner string) error {
	if s.down.Load() {
		return errSecDown
	}
	return s.Store.Release(ctx, key, owner)
}

// secResult is what a client received.
type secResult struct {
	status int
	header http.Header
	body   string
}

func (r secResult) replayed() bool { return r.header.Get("Idempotent-Replayed") == "true" }

// secDo sends a request; header holds name, value pairs (Idempotency-Key
// included). It fails the test on a transport error.
func secDo(t *testing.T, method, url string, body io.Reader, header ...string) secResult {
	t.Helper()
	r, err := secSend(method, url, body, header...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// secSend is secDo for goroutines other than the test's.
func secSend(method, url string, body io.Reader, header ...string) (secResult, error) {
	r, err := http.NewRequest(method, url, body)
	if err != nil {
		return secResult{}, err
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(r)
	if err != nil {
		return secResult{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return secResult{res.StatusCode, res.Header, string(b)}, err
}

// TestSecurityScopesNeverCross sends the same key from every combination
// of principal, method and route: each runs its own handler execution, and
// each retry replays its own response, never another combination's. The
// fingerprint is off, so a record reached across scopes would be
// replayed, not refused.
func TestSecurityScopesNeverCross(t *testing.T) {
	for _, tc := range []struct {
		name       string
		opts       []idem.Option
		principals [][]string // header name, value
	}{
		{"Authorization", []idem.Option{idem.WithScope(idem.AuthorizationScope)}, [][]string{
			{"Authorization", "Bearer alice"}, {"Authorization", "Bearer bob"}, {"Authorization", ""},
		}},
		// The default: the principal that the authentication (here, the
		// X-User header, read before the mux) names.
		{"Principal", nil, [][]string{
			{"X-User", "alice"}, {"X-User", "bob"}, {"X-User", "a:b"}, {"X-User", ""},
		}},
		{"WithScope", []idem.Option{idem.WithScope(func(r *http.Request) string { return r.Header.Get("X-Tenant") })}, [][]string{
			{"X-Tenant", "a:b"}, {"X-Tenant", "a"}, {"X-Tenant", "{a}"}, {"X-Tenant", ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, _ := newMemStore(t)
			m, err := idem.New(store, append([]idem.Option{idem.WithoutFingerprint(), idem.WithMethods("POST", "PATCH")}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int64
			h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, "run %d", runs.Add(1))
			}))
			mux := http.NewServeMux()
			mux.Handle("/a", h) // one pattern for both methods: the method alone separates them
			mux.Handle("/b", h)
			mux.Handle("/a/{id}", h)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mux.ServeHTTP(w, r.WithContext(idem.ContextWithPrincipal(r.Context(), r.Header.Get("X-User"))))
			}))
			defer srv.Close()

			type combo struct{ principal, method, path string }
			first := map[combo]string{}
			for pass := range 2 {
				for _, p := range tc.principals {
					for _, method := range []string{"POST", "PATCH"} {
						for _, path := range []string{"/a", "/b", "/a/1"} {
							c := combo{p[0] + "=" + p[1], method, path}
							r := secDo(t, method, srv.URL+path, nil, "Idempotency-Key", "k", p[0], p[1])
							if pass == 0 {
								if r.replayed() {
									t.Fatalf("%v got another scope's record: %q", c, r.body)
								}
								first[c] = r.body
							} else if !r.replayed() || r.body != first[c] {
								t.Fatalf("%v retry got %q (replayed %v), want its own %q", c, r.body, r.replayed(), first[c])
							}
						}
					}
				}
			}
			if n := int(runs.Load()); n != len(first) {
				t.Fatalf("%d executions for %d scopes", n, len(first))
			}
		})
	}
}

// hostileKeys are keys made of the characters that mean something to
// Redis (hash tags, the ':' convention, glob patterns, spaces), keys that
// look like the store's prefix, and keys of the maximal length.
var hostileKeys = []string{
	"{a}", "{a}:b", "a:{b}", "{", "}", "{}", ":", "::", "a:b", "a::b",
	"*", "a*", "idem:*", "idem:", "idem:a", "[a-z]*", "?", "\\*",
	" ", "a b", " a", "a ", "a  b",
	strings.Repeat("k", 255), strings.Repeat("k", 254) + "K", strings.Repeat("{", 255),
	strings.Repeat(":", 255), strings.Repeat("*", 255), strings.Repeat(" ", 254) + "x",
}

// TestSecurityHostileKeysStayInTheirRecord runs every hostile key, from
// two principals whose scopes differ only in where ':' falls: each key gets
// a record of its own that replays its own response, and the storage key
// the store is given holds no byte the client chose. (The Redis key names
// built from it are checked in internal/tests/conformance.)
func TestSecurityHostileKeysStayInTheirRecord(t *testing.T) {
	ms := memstore.New()
	t.Cleanup(func() { ms.Close() })
	spy := newSecSpy(ms)
	m, err := idem.New(spy, idem.WithoutFingerprint(), idem.WithScope(func(r *http.Request) string { return r.Header.Get("X-Tenant") }))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := idem.FromContext(r.Context())
		io.WriteString(w, r.Header.Get("X-Tenant")+"|"+info.Key)
	})))
	defer srv.Close()

	tenants := []string{"t:1", "t"} // with keys "x" and "1:x": "t:1" + "x" and "t" + "1:x" must not meet
	keys := append([]string{"x", "1:x"}, hostileKeys...)
	for pass := range 2 {
		for _, tenant := range tenants {
			for _, key := range keys {
				sent := key
				if strings.TrimSpace(key) != key { // HTTP trims a bare value: send the RFC 8941 string
					sent = `"` + key + `"`
				}
				r := secDo(t, "POST", srv.URL+"/o", nil, "Idempotency-Key", sent, "X-Tenant", tenant)
				if want := tenant + "|" + key; r.status != 200 || r.body != want || r.replayed() != (pass == 1) {
					t.Fatalf("pass %d, tenant %q, key %q: %d %q (replayed %v), want %q", pass, tenant, key, r.status, r.body, r.replayed(), want)
				}
			}
		}
	}
	if want := len(tenants) * len(keys); len(spy.keys) != want {
		t.Fatalf("%d storage keys for %d records", len(spy.keys), want)
	}
	for k := range spy.keys {
		if len(k) != 22 || strings.ContainsAny(k, "{}:* ") {
			t.Fatalf("the store was given key %q: want 22 base64url characters", k)
		}
	}
}

// countingBody counts the bytes read from a request body.
type countingBody struct {
	io.ReadCloser
	n atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// TestSecurityBodyLimitNotReadPast sends bodies over WithMaxRequestBody:
// with a Content-Length over the limit nothing is read; sent chunked, at
// most limit+1 bytes are read. Both get 413 and never reach the store or
// the handler.
func TestSecurityBodyLimitNotReadPast(t *testing.T) {
	const limit = 1000
	store, _ := newMemStore(t)
	spy := newSecSpy(store)
	m, err := idem.New(spy, idem.WithMaxRequestBody(limit))
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64
	mw := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		io.Copy(io.Discard, r.Body)
	}))
	read := make(chan int64, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := &countingBody{ReadCloser: r.Body}
		r.Body = body
		mw.ServeHTTP(w, r)
		read <- body.n.Load()
	}))
	defer srv.Close()

	big := strings.Repeat("x", 20*limit)
	for _, tc := range []struct {
		name    string
		body    io.Reader
		maxRead int64
	}{
		{"Content-Length", strings.NewReader(big), 0},
		{"chunked", io.MultiReader(strings.NewReader(big)), limit + 1},
	} {
		r := secDo(t, "POST", srv.URL+"/up", tc.body, "Idempotency-Key", "k-"+tc.name)
		if r.status != http.StatusRequestEntityTooLarge {
			t.Fatalf("%s: status %d, want 413", tc.name, r.status)
		}
		if n := <-read; n > tc.maxRead {
			t.Fatalf("%s: %d bytes of the body read, want at most %d", tc.name, n, tc.maxRead)
		}
	}
	if ran.Load() != 0 || spy.acquires.Load() != 0 {
		t.Fatalf("oversized bodies reached the handler (%d) or the store (%d)", ran.Load(), spy.acquires.Load())
	}
	if r := secDo(t, "POST", srv.URL+"/up", strings.NewReader(big[:limit]), "Idempotency-Key", "k-at-limit"); r.status != 200 {
		t.Fatalf("a body at the limit: %d", r.status)
	}
	<-read
}

// TestSecurityLeaseAfterBody stalls a client halfway through its body: no
// lease is taken while the body is read, so the same key sent by another
// connection runs at once (no 409), and the stalled request, once its body
// is complete, gets that response replayed.
func TestSecurityLeaseAfterBody(t *testing.T) {
	store, _ := newMemStore(t)
	spy := newSecSpy(store)
	m, err := idem.New(spy)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	mw := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "run %d: %s", runs.Add(1), b)
	}))
	reading := make(chan struct{}, 1) // the slow request's body is being read
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Slow") != "" {
			r.Body = &signalBody{ReadCloser: r.Body, first: reading}
		}
		mw.ServeHTTP(w, r)
	}))
	defer srv.Close()

	pr, pw := io.Pipe()
	defer pw.CloseWithError(errors.New("test over")) // before srv.Close, which waits for the slow request
	slow := make(chan secResult, 1)
	go func() {
		r, err := secSend("POST", srv.URL+"/o", pr, "Idempotency-Key", "k", "X-Slow", "1")
		if err != nil {
			r.body = err.Error()
		}
		slow <- r
	}()
	if _, err := io.WriteString(pw, "first half, "); err != nil {
		t.Fatal(err)
	}
	<-reading
	if n := spy.acquires.Load(); n != 0 {
		t.Fatalf("%d acquires before the body was read", n)
	}
	fast := secDo(t, "POST", srv.URL+"/o", strings.NewReader("first half, second half"), "Idempotency-Key", "k")
	if fast.status != 200 || fast.replayed() || fast.body != "run 1: first half, second half" {
		t.Fatalf("the same key while another client stalls in its body: %d %q, want it to run", fast.status, fast.body)
	}
	if n := spy.acquires.Load(); n != 1 {
		t.Fatalf("%d acquires, want only the fast request's while the slow body is unfinished", n)
	}
	io.WriteString(pw, "second half")
	pw.Close()
	if r := <-slow; r.status != 200 || !r.replayed() || r.body != fast.body {
		t.Fatalf("the slow request: %d %q (replayed %v), want the replay of %q", r.status, r.body, r.replayed(), fast.body)
	}
}

// signalBody sends on first when its first Read starts.
type signalBody struct {
	io.ReadCloser
	first chan struct{}
	once  sync.Once
}

func (b *signalBody) Read(p []byte) (int, error) {
	b.once.Do(func() { b.first <- struct{}{} })
	return b.ReadCloser.Read(p)
}

// TestSecurityNoSecretsInErrorsOrEvents drives the middleware to every
// refusal and every outcome with a secret Authorization value and a
// recognisable key, and searches every response (headers and body) and
// every observer event (all fields and the error's text) for both. Only a
// custom WithErrorWriter or WithObserver, which get the request, could
// expose them.
func TestSecurityNoSecretsInErrorsOrEvents(t *testing.T) {
	const secret = "Bearer s3cr3t-T0KEN-9f2c"
	const key = "KEY-7f3a9c-raw"
	store, clk := newMemStore(t)
	spy := newSecSpy(store)
	var mu sync.Mutex
	var events []idem.Event
	gate := make(chan struct{})
	entered := make(chan struct{}, 1)
	var leaseRuns atomic.Int64
	newServer := func(opts ...idem.Option) *httptest.Server {
		m, err := idem.New(spy, append([]idem.Option{
			idem.WithObserver(func(ev idem.Event) { mu.Lock(); events = append(events, ev); mu.Unlock() }),
			idem.WithMaxRequestBody(100), idem.WithMaxResponseBody(100), idem.WithLease(time.Hour),
		}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		h := func(f http.HandlerFunc) http.Handler { return nethttp.Middleware(m)(f) }
		mux.Handle("/ok", h(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
		mux.Handle("/fail", h(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "down", http.StatusServiceUnavailable) }))
		mux.Handle("/big", h(func(w http.ResponseWriter, r *http.Request) { w.Write(bytes.Repeat([]byte("b"), 200)) }))
		mux.Handle("/slow", h(func(w http.ResponseWriter, r *http.Request) {
			n := leaseRuns.Add(1)
			if n == 1 {
				entered <- struct{}{}
				<-gate
			}
			fmt.Fprintf(w, "slow run %d", n) // differs, or the late Complete would count as a resend
		}))
		// The application's authentication verifies the secret and names
		// its principal.
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") == secret && r.URL.Query().Get("anonymous") == "" {
				r = r.WithContext(idem.ContextWithPrincipal(r.Context(), "alice"))
			}
			mux.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	srv := newServer()
	strict := newServer(idem.WithRequireKey())
	open := newServer(idem.WithFailOpen())

	var replies []secResult
	send := func(url, k, body string) {
		t.Helper()
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		replies = append(replies, secDo(t, "POST", url, rd, "Idempotency-Key", k, "Authorization", secret))
	}
	send(strict.URL+"/ok", "", "")                     // 400 missing key
	send(srv.URL+"/ok", `"`+key, "")                   // 400 invalid: unterminated
	send(srv.URL+"/ok", strings.Repeat(key, 20), "")   // 400 invalid: too long
	send(srv.URL+"/ok", key, strings.Repeat("x", 101)) // 413
	send(srv.URL+"/ok?anonymous=1", key, "a")          // 500 scope unknown: no principal named
	send(srv.URL+"/ok", key, "a")                      // executed
	send(srv.URL+"/ok", key, "a")                      // replayed
	send(srv.URL+"/ok", key, "b")                      // 422
	send(srv.URL+"/fail", key, "")                     // released
	send(srv.URL+"/big", key, "")                      // not replayable
	send(srv.URL+"/big", key, "")                      // 409 not replayable
	spy.corrupt.Store(true)
	send(srv.URL+"/ok", key, "a") // 500 corrupt record
	spy.corrupt.Store(false)
	spy.down.Store(true)
	send(srv.URL+"/ok", key+"-down", "")  // 503
	send(open.URL+"/ok", key+"-open", "") // failed open
	spy.down.Store(false)

	// 409 in flight, then the lease runs out: the late finish is LeaseLost.
	slow := make(chan secResult, 1)
	go func() {
		r, err := secSend("POST", srv.URL+"/slow", nil, "Idempotency-Key", key, "Authorization", secret)
		if err != nil {
			r.body = err.Error()
		}
		slow <- r
	}()
	<-entered
	defer close(gate)              // on failure too: the servers' Close waits for the handler
	send(srv.URL+"/slow", key, "") // 409 in flight
	clk.Advance(2 * time.Hour)
	send(srv.URL+"/slow", key, "") // runs again
	gate <- struct{}{}
	replies = append(replies, <-slow)

	statuses := map[int]bool{}
	for _, r := range replies {
		statuses[r.status] = true
		for name, vs := range r.header {
			for _, v := range vs {
				if strings.Contains(v, key) || strings.Contains(v, "s3cr3t") {
					t.Errorf("%d response header %s: %q", r.status, name, v)
				}
			}
		}
		if strings.Contains(r.body, key) || strings.Contains(r.body, "s3cr3t") {
			t.Errorf("%d response body: %s", r.status, r.body)
		}
	}
	for _, s := range []int{400, 413, 409, 422, 500, 503} {
		if !statuses[s] {
			t.Errorf("no %d among the replies: the test did not reach every refusal", s)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	outcomes := map[idem.Outcome]bool{}
	for _, ev := range events {
		outcomes[ev.Outcome] = true
		text := fmt.Sprintf("%#v", ev)
		if ev.Err != nil {
			text += " " + ev.Err.Error()
		}
		if strings.Contains(text, key) || strings.Contains(text, "s3cr3t") {
			t.Errorf("event %v holds a secret: %s", ev.Outcome, text)
		}
	}
	for _, o := range []idem.Outcome{idem.Executed, idem.Replayed, idem.Conflict, idem.Mismatch, idem.Released,
		idem.NotReplayable, idem.Rejected, idem.StoreError, idem.FailedOpen, idem.LeaseLost} {
		if !outcomes[o] {
			t.Errorf("no %v event: the test did not reach every outcome", o)
		}
	}
}
