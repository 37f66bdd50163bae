// Command nethttp serves an order endpoint protected by idem on net/http.
//
//	go run ./examples/nethttp                  # serve on localhost:8080, memory store
//	go run ./examples/nethttp -redis localhost:6379
//	go run ./examples/nethttp -demo            # run a scripted client against it, then exit
//
// POST /orders creates an order and answers with its number; handler_runs
// shows how many times the handler really ran. examples/gin and
// examples/echo are the same application on Gin and Echo.
package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/demo"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
)

func main() { demo.Main(newServer) }

// newServer builds the application: one protected endpoint. It returns the
// middleware too, whose Shutdown demo.Main calls after the server's, so
// that a deploy does not lose the record of a finished request.
func newServer(store storage.Store, env *demo.Env) (http.Handler, *idem.Middleware, error) {
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
