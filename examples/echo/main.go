// Command echo serves an order endpoint protected by idem on Echo.
//
//	go run ./examples/echo                     # serve on localhost:8080, memory store
//	go run ./examples/echo -redis localhost:6379
//	go run ./examples/echo -demo               # run a scripted client against it, then exit
//
// The same application as examples/nethttp. The middleware sits after the
// request logger (which then logs replays and refusals with their real
// status) and after Recover (so a panicking handler releases its key before
// Recover answers 500). A handler's returned error, here the 400 for a bad
// body, is rendered inside the middleware, so it is stored and replayed
// like any other response.
package main

import (
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/examples/internal/demo"
	"github.com/idemkit/idem/storage"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
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
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Use(middleware.RequestLogger(), middleware.Recover(), echoidem.Middleware(m))
	e.POST("/orders", func(c echo.Context) error {
		var in demo.Order
		if err := c.Bind(&in); err != nil {
			return echo.NewHTTPError(http.StatusBadRequest, "bad JSON")
		}
		env.Slow(c.Request()) // ?slow=1 holds the request, to show a double click
		n := orders.Add(1)
		c.Response().Header().Set("Location", fmt.Sprintf("/orders/%d", n))
		return c.JSON(http.StatusCreated, map[string]any{"order": n, "item": in.Item, "amount": in.Amount, "handler_runs": n})
	})
	return e, m, nil
}
