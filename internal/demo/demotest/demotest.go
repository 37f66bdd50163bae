// Package demotest checks an example application with the scripted client
// of package demo, on the memory store and on Redis (miniredis), so that
// the README's demo command keeps telling the truth.
package demotest

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem/internal/demo"
	"github.com/idemkit/idem/storage"
)

// Run serves the application built by newServer on each store and runs
// demo.Client against it; any answer other than the promised one fails t.
func Run(t *testing.T, newServer demo.NewServer) {
	t.Run("memory", func(t *testing.T) {
		store, closeStore := demo.OpenStore("")
		t.Cleanup(closeStore)
		check(t, newServer, store)
	})
	t.Run("redis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		store, closeStore := demo.OpenStore(mr.Addr())
		t.Cleanup(closeStore)
		check(t, newServer, store)
		if n := len(mr.Keys()); n != 2 {
			t.Errorf("Redis holds %d keys after the demo, want 2 (order-1 and order-2): %v", n, mr.Keys())
		}
	})
}

func check(t *testing.T, newServer demo.NewServer, store storage.Store) {
	var log strings.Builder
	h, err := newServer(store, demo.NewEnv(&log))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	var out strings.Builder
	if err := demo.Client(&out, srv.URL); err != nil {
		t.Errorf("%v\ntranscript:%s\nlog:\n%s", err, out.String(), log.String())
	}
	// handler_runs shows the handler ran once per key.
	if got := strings.Count(out.String(), `"handler_runs":1`); got != 2 {
		t.Errorf("the first order's response appears %d times, want 2 (original and replay):%s", got, out.String())
	}
	if !strings.Contains(out.String(), `"handler_runs":2`) || strings.Contains(out.String(), `"handler_runs":3`) {
		t.Errorf("the double click did not run the handler exactly once more:%s", out.String())
	}
}
