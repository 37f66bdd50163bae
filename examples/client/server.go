package main

// This file is the order application that the client drives when no -addr
// is given: examples/nethttp's, served in-process.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
)

// newServer builds the application on store: one protected endpoint,
// logging idem's decisions to logTo. clicks is the demo's hook (nil: none;
// see demo.go). It returns the middleware too, for its Shutdown.
func newServer(store storage.Store, logTo io.Writer, clicks *doubleClicks) (http.Handler, *idem.Middleware, error) {
	m, err := idem.New(store,
		idem.WithObserver(func(ev idem.Event) {
			fmt.Fprintf(logTo, "idem: %s %s -> %s %d (%v)\n", ev.Method, ev.Route, ev.Outcome, ev.Status, ev.Duration.Round(time.Microsecond))
		}),
		idem.WithErrorWriter(clicks.writeError), // idem.WriteProblem; see demo.go
	)
	if err != nil {
		return nil, nil, err
	}
	var orders atomic.Int64
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Item   string `json:"item"`
			Amount int    `json:"amount"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, "bad JSON", http.StatusBadRequest)
			return
		}
		clicks.hold(r) // ?slow=1 waits for its duplicate's 409 (demo.go)
		n := orders.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]any{"order": n, "item": in.Item, "amount": in.Amount, "handler_runs": n})
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", nethttp.Middleware(m)(create))
	return mux, m, nil
}

// doubleClicks holds a request whose query has slow=1 in its handler until
// idem has turned away a duplicate of it (the same Idempotency-Key) with
// 409, or for 3 seconds: the demo's double click then shows the 409 on any
// machine. Other requests pass at once.
type doubleClicks struct {
	mu      sync.Mutex
	pending map[string]chan struct{} // by key; closed once a duplicate got 409
}

func newDoubleClicks() *doubleClicks {
	return &doubleClicks{pending: make(map[string]chan struct{})}
}

// of returns the channel of key's double click, made on first use; d.mu is
// held.
func (d *doubleClicks) of(key string) chan struct{} {
	ch, ok := d.pending[key]
	if !ok {
		ch = make(chan struct{})
		d.pending[key] = ch
	}
	return ch
}

// hold is called by the handler: it waits while r is the first of a double
// click.
func (d *doubleClicks) hold(r *http.Request) {
	if d == nil || r.URL.Query().Get("slow") == "" {
		return
	}
	key := r.Header.Get("Idempotency-Key")
	d.mu.Lock()
	ch := d.of(key) // the 409 may have come first: then ch is closed
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		if d.pending[key] == ch {
			delete(d.pending, key)
		}
		d.mu.Unlock()
	}()
	t := time.NewTimer(3 * time.Second)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-r.Context().Done():
	}
}

// writeError is idem's error writer: idem.WriteProblem, the default, and
// for the 409 of a slow=1 duplicate it lets the first request go on.
func (d *doubleClicks) writeError(w http.ResponseWriter, r *http.Request, err *idem.Error) {
	if d != nil && errors.Is(err, idem.ErrConflict) && r.URL.Query().Get("slow") != "" {
		d.mu.Lock()
		ch := d.of(r.Header.Get("Idempotency-Key"))
		select {
		case <-ch:
		default:
			close(ch)
		}
		d.mu.Unlock()
	}
	idem.WriteProblem(w, r, err)
}
