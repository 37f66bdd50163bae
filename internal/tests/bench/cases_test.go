package bench

import (
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/response"
)

// benchCase is one kind of request, prepared on a setup.
type benchCase struct {
	name  string
	large bool // runs on the setup whose handler answers 1 MiB
	// prepare readies the store (a stored record, a held key) and returns
	// the function that sends one request and the one that checks the last
	// answer, kept apart so that benchmarks measure only the request.
	prepare func(tb testing.TB, s *setup) (send func(), ok func() bool)
}

var cases = []benchCase{
	{name: "bare", prepare: func(tb testing.TB, s *setup) (func(), func() bool) {
		c := newClient(s.bare, http.MethodPost)
		return c.send, func() bool { return c.w.status == http.StatusCreated }
	}},
	{name: "passthrough", prepare: func(tb testing.TB, s *setup) (func(), func() bool) {
		c := newClient(s.h, http.MethodGet)
		return c.send, func() bool { return c.w.status == http.StatusCreated && !c.replayed() }
	}},
	{name: "first", prepare: first},
	{name: "replay", prepare: func(tb testing.TB, s *setup) (func(), func() bool) {
		c := newClient(s.h, http.MethodPost)
		c.setKey(keySeq.Add(1))
		if c.send(); c.w.status != http.StatusCreated {
			tb.Fatalf("replay: the first request got %d", c.w.status)
		}
		return c.send, func() bool { return c.w.status == http.StatusCreated && c.replayed() }
	}},
	{name: "conflict", prepare: func(tb testing.TB, s *setup) (func(), func() bool) {
		c := newClient(s.h, http.MethodPost)
		c.setKey(keySeq.Add(1))
		tb.Cleanup(s.hold(tb, c.r.Header.Get("Idempotency-Key")))
		return c.send, func() bool { return c.w.status == http.StatusConflict }
	}},
	{name: "large", large: true, prepare: first},
}

// first sends every request with a new key: each is a first execution.
func first(tb testing.TB, s *setup) (func(), func() bool) {
	c := newClient(s.h, http.MethodPost)
	send := func() {
		c.setKey(keySeq.Add(1))
		c.send()
	}
	return send, func() bool { return c.w.status == http.StatusCreated && !c.replayed() }
}

// keySeq numbers the keys of the whole test binary, so that no two
// benchmark runs (-count) or tests on one store share a key.
var keySeq atomic.Uint64

func (c *client) replayed() bool { return c.w.h.Get(response.ReplayedHeader) == "true" }

func caseNamed(name string) benchCase {
	for _, c := range cases {
		if c.name == name {
			return c
		}
	}
	panic("no case " + name)
}
