// Command upstream is a service that knows nothing of idem: it places an
// order for every POST /orders it gets, and lists them on GET /orders. Put
// idem-gateway in front of it and a retried POST places one order:
//
//	go run ./examples/upstream                                                # this service, on 127.0.0.1:9000
//	go run ./cmd/idem-gateway -config cmd/idem-gateway/gateway.example.yaml   # the gateway, on 127.0.0.1:8080
//	curl -i -X POST localhost:8080/orders -H 'Idempotency-Key: k1' -d '{"item":"book"}'   # twice: one order
//	curl localhost:9000/orders                                                # the orders placed
package main

import (
	"encoding/json"
	"flag"
	"io"
	"log"
	"net/http"
	"sync"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9000", "listen address")
	flag.Parse()
	log.Printf("upstream on http://%s", *addr)
	srv := &http.Server{Addr: *addr, Handler: newService(), ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

type order struct {
	ID   int             `json:"id"`
	Item json.RawMessage `json:"request"`
}

// newService returns the orders service.
func newService() http.Handler {
	var mu sync.Mutex
	var orders []order
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil || !json.Valid(body) {
			http.Error(w, "want a JSON body", http.StatusBadRequest)
			return
		}
		mu.Lock()
		o := order{ID: len(orders) + 1, Item: body}
		orders = append(orders, o)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(o)
	})
	mux.HandleFunc("GET /orders", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(orders)
	})
	return mux
}
