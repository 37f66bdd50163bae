package conformance

import (
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// The scenarios of this file use server-issued one-time keys
// (WithIssuedKeys): the server hands out a key with a form, the first
// submit takes it, a double submit gets the first's result, and a key the
// server did not issue to this client is refused.
func init() { scenarios = append(scenarios, issuedScenarios...) }

var (
	alice = http.Header{"Authorization": {"Bearer alice"}}
	bob   = http.Header{"Authorization": {"Bearer bob"}}
)

// issue asks e's middleware for a key for the client whose headers are h,
// as the handler that renders the form does.
func (e *env) issue(h http.Header) string {
	e.t.Helper()
	r := httptest.NewRequest(http.MethodGet, "/form", nil)
	for k, v := range h {
		r.Header[k] = v
	}
	key, err := e.m.IssueKey(withPrincipal(r))
	if err != nil {
		e.t.Fatalf("IssueKey: %v", err)
	}
	return key
}

// orderHandler answers 201 with the order's number, the n-th run.
func orderHandler(c *counter) http.Handler {
	var mu sync.Mutex
	n := 0
	return c.wrap(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		n++
		id := n
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d for %s", id, body)
	})
}

var issuedScenarios = []scenario{
	// A double submit: many at once, then again later: one order, the
	// same answer for all.
	{"IssuedKeyOnce", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/orders", orderHandler(&c)}}, idem.WithIssuedKeys(time.Hour), idem.WithWait(10*time.Second))
		key := e.issue(alice)
		const n = 8
		replies := make([]reply, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { replies[i] = e.do(req{path: "/orders", key: key, body: "2 books", header: alice}) })
		}
		wg.Wait()
		replies = append(replies, e.do(req{path: "/orders", key: key, body: "2 books", header: alice}))
		var first reply
		for _, r := range replies {
			if r.header.Get("Idempotent-Replayed") == "" {
				first = r
			}
		}
		if first.status != http.StatusCreated || string(first.body) != "order 1 for 2 books" {
			t.Fatalf("first submit: %v (all: %v)", first, replies)
		}
		for _, r := range replies {
			if r.status != first.status || string(r.body) != string(first.body) {
				t.Fatalf("submit got %v, first %v", r, first)
			}
		}
		c.want(t, 1)
	}},
	// A key the server never issued, another client's key, none at all:
	// refused before the handler, and the other client's key is still
	// good for its owner.
	{"IssuedKeyRefused", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/orders", orderHandler(&c)}}, idem.WithIssuedKeys(time.Hour))
		problem(t, e.do(req{path: "/orders", key: rand.Text(), body: "x", header: alice}), 400, idem.ErrKeyNotIssued)
		problem(t, e.do(req{path: "/orders", body: "x", header: alice}), 400, idem.ErrMissingKey)
		key := e.issue(alice)
		problem(t, e.do(req{path: "/orders", key: key, body: "x", header: bob}), 400, idem.ErrKeyNotIssued)
		problem(t, e.do(req{path: "/orders", key: key, body: "x"}), 400, idem.ErrKeyNotIssued)
		c.want(t, 0)
		if r := e.do(req{path: "/orders", key: key, body: "x", header: alice}); r.status != http.StatusCreated {
			t.Fatalf("alice after bob tried her key: %v", r)
		}
		c.want(t, 1)
	}},
	// An issued key unused for its TTL expires.
	{"IssuedKeyExpires", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/orders", orderHandler(&c)}}, idem.WithIssuedKeys(time.Minute))
		key := e.issue(alice)
		e.advance(time.Minute + time.Second)
		problem(t, e.do(req{path: "/orders", key: key, body: "x", header: alice}), 400, idem.ErrKeyNotIssued)
		c.want(t, 0)
	}},
	// A failed first use (5xx: released) leaves the key usable: the
	// retry runs the handler, and then the key replays.
	{"IssuedKeyReleasedUsableAgain", func(t *testing.T, s *suite) {
		var c counter
		fail := true
		e := s.env([]Route{{"POST", "/orders", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			if fail {
				fail = false
				http.Error(w, "database busy", http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "created")
		})}}, idem.WithIssuedKeys(time.Hour))
		key := e.issue(alice)
		if r := e.do(req{path: "/orders", key: key, header: alice}); r.status != http.StatusServiceUnavailable {
			t.Fatalf("first: %v", r)
		}
		first := e.do(req{path: "/orders", key: key, header: alice})
		if first.status != http.StatusCreated {
			t.Fatalf("retry after the 503: %v", first)
		}
		sameResponse(t, first, e.do(req{path: "/orders", key: key, header: alice}))
		c.want(t, 2)
	}},
	// An HTML form carries the key in a hidden field (a form cannot set a
	// header): WithKey reads it.
	{"IssuedKeyFromForm", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/orders", orderHandler(&c)}},
			idem.WithIssuedKeys(time.Hour), idem.WithKey(idem.KeyFromForm("idempotency_key")))
		key := e.issue(alice)
		form := url.Values{"idempotency_key": {key}, "item": {"book"}}.Encode()
		h := http.Header{"Authorization": alice["Authorization"], "Content-Type": {"application/x-www-form-urlencoded"}}
		first := e.do(req{path: "/orders", body: form, header: h})
		if first.status != http.StatusCreated {
			t.Fatalf("submit: %v", first)
		}
		sameResponse(t, first, e.do(req{path: "/orders", body: form, header: h}))
		forged := url.Values{"idempotency_key": {rand.Text()}, "item": {"book"}}.Encode()
		problem(t, e.do(req{path: "/orders", body: forged, header: h}), 400, idem.ErrKeyNotIssued)
		c.want(t, 1)
	}},
}
