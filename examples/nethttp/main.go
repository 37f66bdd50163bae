// Command nethttp serves an order endpoint protected by idem on net/http.
//
//	go run ./examples/nethttp                  # serve on localhost:8080, memory store
//	go run ./examples/nethttp -redis localhost:6379
//	go run ./examples/nethttp -demo            # run a scripted client against it, then exit
//
// POST /orders creates an order and answers with its number; handler_runs
// shows how many times the handler really ran. The application is in
// package orders (examples/nethttp/orders), which examples/client serves
// too. examples/gin and examples/echo are the same application on Gin and
// Echo.
package main

import (
	"github.com/idemkit/idem/examples/internal/demo"
	"github.com/idemkit/idem/examples/nethttp/orders"
)

func main() { demo.Main(orders.New) }
