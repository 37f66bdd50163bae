package main

// This file is the order application that the client drives when no -addr
// is given: examples/nethttp's, served in-process.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/democlient"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// serve serves the application on a free port of the loopback, on Redis
// at redisAddr or, when it is empty, on the memory store, logging idem's
// decisions to logw. It returns its base URL ("http://host:port") and the
// function that shuts it down in the order a deploy needs.
func serve(redisAddr string, logw io.Writer) (base string, stop func() error, err error) {
	var (
		store      storage.Store
		closeStore func() error
	)
	if redisAddr == "" {
		ms := memstore.New()
		store, closeStore = ms, ms.Close
	} else {
		rdb := redis.NewClient(redisstore.ClientOptions(redisAddr))
		store, closeStore = redisstore.New(rdb), rdb.Close
	}
	h, m, err := newServer(store, logw, democlient.NewClicks())
	if err != nil {
		return "", nil, errors.Join(err, closeStore())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, errors.Join(err, closeStore())
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return "http://" + ln.Addr().String(), func() error {
		// 1. the server, 2. idem: every record stored, 3. the store, last.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return errors.Join(srv.Shutdown(ctx), m.Shutdown(ctx), closeStore())
	}, nil
}

// newServer builds the application on store: one protected endpoint,
// logging idem's decisions to logTo. clicks is the demo's hook (nil: none;
// see package democlient). It returns the middleware too, for its Shutdown.
func newServer(store storage.Store, logTo io.Writer, clicks *democlient.Clicks) (http.Handler, *idem.Middleware, error) {
	m, err := idem.New(store,
		idem.WithObserver(func(ev idem.Event) {
			fmt.Fprintf(logTo, "idem: %s %s -> %s %d (%v)\n", ev.Method, ev.Route, ev.Outcome, ev.Status, ev.Duration.Round(time.Microsecond))
		}),
		idem.WithErrorWriter(clicks.WriteError), // idem.WriteProblem; democlient adds the double click
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
		clicks.Hold(r) // ?slow=1 waits for its duplicate's 409 (democlient)
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
