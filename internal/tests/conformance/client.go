package conformance

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/storage/memstore"
)

// This file is the client harness of the adapters' own trap tests (the
// framework-specific cases that plain http.Handlers cannot reach): a real
// server over a fresh store of each kind, a client that posts with a key,
// and the checks those tests share.

// trapStores are the store kinds a trap test runs on: the in-process ones,
// so that the framework, not the store, is what the test is about.
var trapStores = map[string]bool{"memory": true, "miniredis": true}

// Open starts a [Server]: a router from the newRouter given to
// [EachStore], set up by setup with a Middleware on a fresh store whose
// events the Server records.
type Open[R http.Handler] func(setup func(R, *idem.Middleware)) *Server

// EachStore runs f once per trap-test store kind (memory, miniredis), in
// parallel subtests named after the kind. newRouter returns the framework's
// router with its panic recovery installed (gin.New plus gin.Recovery...).
func EachStore[R http.Handler](t *testing.T, newRouter func() R, f func(t *testing.T, open Open[R])) {
	t.Helper()
	n := 0
	for _, sk := range storeKinds {
		if !trapStores[sk.name] {
			continue
		}
		n++
		t.Run(sk.name, func(t *testing.T) {
			t.Parallel()
			f(t, func(setup func(R, *idem.Middleware)) *Server {
				store, _ := sk.open(t)
				ev := &events{}
				m, err := idem.New(store, idem.WithObserver(ev.observe))
				if err != nil {
					t.Fatal(err)
				}
				r := newRouter()
				setup(r, m)
				return newServer(t, r, ev)
			})
		})
	}
	if n != len(trapStores) {
		t.Fatalf("EachStore found %d of the %d trap store kinds", n, len(trapStores))
	}
}

// Server is a real HTTP server under test, closed when the test ends.
type Server struct {
	t   *testing.T
	srv *httptest.Server
	ev  *events
}

// newServer serves h on a real listener; ev is the observer's record that
// [Server.Outcomes] reports.
func newServer(t *testing.T, h http.Handler, ev *events) *Server {
	s := &Server{t: t, srv: httptest.NewServer(h), ev: ev}
	t.Cleanup(s.srv.Close)
	return s
}

// Outcomes returns the outcomes the middleware's observer has reported so
// far, in order.
func (s *Server) Outcomes() []idem.Outcome { return s.ev.outcomes() }

// WaitOutcomes waits until the observer has reported at least n outcomes
// and returns them; it fails the test after 10 s. The middleware reports an
// execution only after its store write, which the client's response may
// precede (a hijacked connection is answered by the handler itself).
func (s *Server) WaitOutcomes(n int) []idem.Outcome {
	s.t.Helper()
	got := s.ev.waitLen(n, 10*time.Second)
	if len(got) < n {
		s.t.Fatalf("the observer reported %v, want %d outcomes", got, n)
	}
	return got
}

// Reply is what a client received, the body read to the end.
type Reply struct {
	Status int
	Header http.Header
	Body   string
}

// Post sends a POST of body to path, with Idempotency-Key key unless key
// is "", and reads the whole reply. It fails the test on a transport error.
func (s *Server) Post(path, key, body string) Reply {
	s.t.Helper()
	r := (&env{t: s.t, srv: s.srv}).post(path, key, body)
	return Reply{r.status, r.header, string(r.body)}
}

// Send is [Server.Post] for a test that reads the body itself, while the
// handler still runs; the caller closes it.
func (s *Server) Send(path, key, body string) *http.Response {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.srv.URL+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := s.srv.Client().Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	return res
}

// PostStreamed sends like [Server.Send] to a handler that flushes first and
// then waits for proceed: it requires first to reach the client while the
// handler waits, then closes proceed and returns the whole reply.
func (s *Server) PostStreamed(path, key, first string, proceed chan<- struct{}) Reply {
	s.t.Helper()
	res := s.Send(path, key, "")
	defer res.Body.Close()
	head := make([]byte, len(first))
	if _, err := io.ReadFull(res.Body, head); err != nil || string(head) != first {
		s.t.Fatalf("first chunk %q, want %q: %v", head, first, err)
	}
	close(proceed)
	rest, _ := io.ReadAll(res.Body)
	return Reply{res.StatusCode, res.Header, string(head) + string(rest)}
}

// SameReply requires r to be a replay of orig: the same status, body and
// Content-Type, Idempotent-Replayed: true on r and absent from orig.
func SameReply(t *testing.T, orig, r Reply) {
	t.Helper()
	if r.Status != orig.Status || r.Body != orig.Body || r.Header.Get("Content-Type") != orig.Header.Get("Content-Type") {
		t.Fatalf("replay %d %q %q, original %d %q %q", r.Status, r.Header.Get("Content-Type"), r.Body,
			orig.Status, orig.Header.Get("Content-Type"), orig.Body)
	}
	if r.Header.Get("Idempotent-Replayed") != "true" || orig.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("Idempotent-Replayed: original %q, replay %q", orig.Header.Get("Idempotent-Replayed"), r.Header.Get("Idempotent-Replayed"))
	}
}

// WantOwnHeaders requires retry, a replay of first, to carry the
// X-Request-Id a middleware before idem's set for each request (req-1, then
// req-2), not the first request's, and the handler's X-Order: 42.
func WantOwnHeaders(t *testing.T, first, retry Reply) {
	t.Helper()
	SameReply(t, first, retry)
	if first.Header.Get("X-Request-Id") != "req-1" || retry.Header.Get("X-Request-Id") != "req-2" {
		t.Fatalf("X-Request-Id: first %q, replay %q; want req-1, req-2",
			first.Header.Get("X-Request-Id"), retry.Header.Get("X-Request-Id"))
	}
	if retry.Header.Get("X-Order") != "42" {
		t.Fatalf("the handler's header was not replayed: %v", retry.Header)
	}
}

// WantReplayed requires orig to have status and body, a POST of an empty
// body to path with key to replay it ([SameReply]), and the handler to have
// run once in all.
func (s *Server) WantReplayed(orig Reply, status int, body, path, key string, runs *Runs) {
	s.t.Helper()
	if orig.Status != status || orig.Body != body {
		s.t.Fatalf("original: %v, want %d %q", orig, status, body)
	}
	SameReply(s.t, orig, s.Post(path, key, ""))
	runs.Want(s.t, 1)
}

// Runs counts a handler's executions. The zero value is ready.
type Runs struct{ c counter }

// Add adds d and returns the new count.
func (r *Runs) Add(d int64) int64 { return r.c.n.Add(d) }

// Load returns the count.
func (r *Runs) Load() int64 { return r.c.n.Load() }

// Want fails the test unless the handler ran n times.
func (r *Runs) Want(t *testing.T, n int64) {
	t.Helper()
	r.c.want(t, n)
}

// WaitOrTimeout waits for c, or reports msg with t.Error after 10 s and
// returns, so that a handler that waits for the client cannot hang a test.
func WaitOrTimeout(t *testing.T, c <-chan struct{}, msg string) {
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Error(msg)
	}
}

// NewMiddleware returns a Middleware with opts on a fresh memory store that
// is closed when the test ends, for tests that serve through a recorder.
func NewMiddleware(t *testing.T, opts ...idem.Option) *idem.Middleware {
	t.Helper()
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	m, err := idem.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var (
	paramRE    = regexp.MustCompile(`\{(\w+)\}`)
	catchAllRE = regexp.MustCompile(`\{(\w+)\.\.\.\}`)
)

// ColonPattern translates a [Route]'s net/http pattern to the colon syntax
// of Gin and Echo: "{id}" becomes ":id", and "{rest...}" becomes catchAll,
// in which $1 stands for the name ("*$1" for Gin, "*" for Echo).
func ColonPattern(p, catchAll string) string {
	return paramRE.ReplaceAllString(catchAllRE.ReplaceAllString(p, catchAll), ":$1")
}
