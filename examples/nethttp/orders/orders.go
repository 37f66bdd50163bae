// Package orders is the order application that examples/client serves
// in-process (the application of examples/nethttp, on package demo): one
// order endpoint protected by idem on net/http.
//
//	POST /orders   {"item":"book","amount":12}
//	-> 201 {"amount":12,"handler_runs":1,"item":"book","order":1}
//
// handler_runs shows how many times the handler really ran.
package orders

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/demo"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
)

// New builds the application: one protected endpoint. It returns the
// middleware too, whose Shutdown runs after the server's, so that a deploy
// does not lose the record of a finished request.
func New(store storage.Store, env *demo.Env) (http.Handler, *idem.Middleware, error) {
	m, err := idem.New(store,
		idem.WithObserver(env.Observe),       // logs each decision
		idem.WithErrorWriter(env.WriteError), // idem.WriteProblem; a 409 also ends the wait of ?slow=1
	)
	if err != nil {
		return nil, nil, err
	}
	var orders atomic.Int64
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in demo.Order
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, "bad JSON", http.StatusBadRequest)
			return
		}
		env.Slow(r) // ?slow=1 holds the request, to show a double click
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
