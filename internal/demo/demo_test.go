package demo_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/demo"
	"github.com/idemkit/idem/internal/demo/demotest"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newServer is examples/nethttp's application.
func newServer(store storage.Store, env *demo.Env) (http.Handler, *idem.Middleware, error) {
	m, err := idem.New(store, idem.WithObserver(env.Observe), idem.WithErrorWriter(env.WriteError))
	if err != nil {
		return nil, nil, err
	}
	var orders atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /orders", nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in demo.Order
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, "bad JSON", http.StatusBadRequest)
			return
		}
		env.Slow(r)
		n := orders.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]any{"order": n, "item": in.Item, "amount": in.Amount, "handler_runs": n})
	})))
	return mux, m, nil
}

var keyRE = regexp.MustCompile(`Idempotency-Key: (order-[12]-[0-9a-f]{8})'`)

// TestClientTwice: the scripted client passes twice in a row against one
// server on the memory store, each run with keys of its own, and each
// double click ends in one 201 and one 409.
func TestClientTwice(t *testing.T) {
	store, closeStore := demo.OpenStore("")
	defer closeStore()
	s := demotest.Serve(t, newServer, store)
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
	s := demotest.Serve(t, newServer, store)
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
