package demo_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/examples/internal/demo"
	"github.com/idemkit/idem/examples/internal/demo/demotest"
	"github.com/idemkit/idem/examples/nethttp/orders"
	"github.com/idemkit/idem/internal/leakcheck"
)

// TestMain fails the run if a test leaves a goroutine behind.
func TestMain(m *testing.M) { leakcheck.Main(m) }

var keyRE = regexp.MustCompile(`Idempotency-Key: (order-[12]-[0-9a-f]{8})'`)

// TestClientTwice: the scripted client passes twice in a row against one
// server on the memory store, each run with keys of its own, and each
// double click ends in one 201 and one 409.
func TestClientTwice(t *testing.T) {
	store, closeStore := demo.OpenStore("")
	defer closeStore()
	s := demotest.Serve(t, orders.New, store)
	seen := map[string]int{}
	for run := range 2 {
		for _, m := range keyRE.FindAllStringSubmatch(s.Check(t, run), -1) {
			seen[m[1]] |= 1 << run
		}
	}
	// Each run shows 2 keys, order-1-RUN and order-2-RUN, none shared.
	if len(seen) != 4 {
		t.Errorf("keys in the transcripts: %v, want 2 per run, none shared", seen)
	}
	for k, runs := range seen {
		if runs == 3 {
			t.Errorf("key %s used by both runs", k)
		}
	}
}

// TestClientsAtOnce: three clients at once against one server each get
// their promised answers: every double click waits for its own 409.
func TestClientsAtOnce(t *testing.T) {
	store, closeStore := demo.OpenStore("")
	defer closeStore()
	s := demotest.Serve(t, orders.New, store)
	const clients = 3
	errs := make([]error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			if err := demo.Client(io.Discard, s.URL); err != nil {
				errs[i] = fmt.Errorf("client %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// TestDuplicates: a burst of identical requests passes Duplicates' check
// on the memory store, and fails it without the middleware, where the
// handler runs for each.
func TestDuplicates(t *testing.T) {
	store, closeStore := demo.OpenStore("")
	defer closeStore()
	s := demotest.Serve(t, orders.New, store)
	var out strings.Builder
	if err := demo.Duplicates(&out, s.URL, "burst", `{"item":"lamp","amount":40}`, 6); err != nil {
		t.Fatalf("%v\ntranscript:\n%s", err, out.String())
	}
	if got := out.String(); !strings.Contains(got, "6 identical requests at once") || !strings.Contains(got, "HTTP 201") ||
		!regexp.MustCompile(`the 5 others: \d x 201 with Idempotent-Replayed: true and this body, \d x 409`).MatchString(got) {
		t.Errorf("transcript:\n%s", got)
	}

	var runs atomic.Int64
	bare := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "run %d\n", runs.Add(1))
	}))
	defer bare.Close()
	err := demo.Duplicates(io.Discard, bare.URL, "burst", "{}", 3)
	if err == nil || !strings.Contains(err.Error(), "the handler answered 3 of them, want 1") {
		t.Errorf("without the middleware: %v, want an error: the handler answered 3", err)
	}
}
