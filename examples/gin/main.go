// Command gin serves an order endpoint protected by idem on Gin.
//
//	go run ./examples/gin                      # serve on localhost:8080, memory store
//	go run ./examples/gin -redis localhost:6379
//	go run ./examples/gin -demo                # run a scripted client against it, then exit
//
// The same application as examples/nethttp. The middleware sits after
// gin.Logger (which then logs replays and refusals with their real status)
// and after gin.Recovery (so a panicking handler releases its key before
// Recovery answers 500).
package main

import (
	"fmt"
	"net/http"
	"os"
	"sync/atomic"

	"github.com/gin-gonic/gin"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/demo"
	"github.com/idemkit/idem/ginidem"
	"github.com/idemkit/idem/storage"
)

func main() {
	gin.SetMode(gin.ReleaseMode)
	gin.DefaultWriter = os.Stderr // the access log; stdout is the demo's transcript
	demo.Main(newServer)
}

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
	r := gin.New()
	r.Use(gin.Logger(), gin.Recovery(), ginidem.Middleware(m))
	r.POST("/orders", func(c *gin.Context) {
		var in demo.Order
		if err := c.ShouldBindJSON(&in); err != nil {
			c.JSON(http.StatusBadRequest, gin.H{"error": "bad JSON"})
			return
		}
		env.Slow(c.Request) // ?slow=1 holds the request, to show a double click
		n := orders.Add(1)
		c.Header("Location", fmt.Sprintf("/orders/%d", n))
		c.JSON(http.StatusCreated, gin.H{"order": n, "item": in.Item, "amount": in.Amount, "handler_runs": n})
	})
	return r, m, nil
}
