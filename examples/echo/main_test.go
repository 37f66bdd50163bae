package main

import (
	"context"
	"github.com/idemkit/idem/examples/democlient"
	"io"
	"net/http/httptest"
	"testing"

	"github.com/idemkit/idem/examples/internal/demotest"
	"github.com/idemkit/idem/storage"
)

// start serves the application on store as main does with -demo.
func start(t *testing.T, store storage.Store) (string, func()) {
	h, m, err := newServer(store, io.Discard, democlient.NewClicks())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	stop := func() {
		srv.Close()
		if err := m.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(stop)
	return srv.URL, stop
}

// TestDemo runs what `go run ./examples/echo -demo` runs, on the memory
// store and on Redis.
func TestDemo(t *testing.T) { demotest.Run(t, start, democlient.Play) }

// TestREADMETranscript: the transcript in the README is what the demo
// prints (its keys' run id and the server's address aside, which the README
// fixes).
func TestREADMETranscript(t *testing.T) { demotest.CheckREADME(t, start, democlient.Play) }
