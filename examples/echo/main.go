// Command echo serves an order endpoint protected by idem on Echo.
//
//	go run ./examples/echo                     # serve on localhost:8080, memory store
//	go run ./examples/echo -redis localhost:6379
//	go run ./examples/echo -demo               # serve on a free port, run a scripted client against it, exit
//
// The same application as examples/nethttp. The middleware sits after the
// request logger (which then logs replays and refusals with their real
// status) and after Recover (so a panicking handler releases its key before
// Recover answers 500). A handler's returned error, here the 400 for a bad
// body, is rendered inside the middleware, so it is stored and replayed
// like any other response. -demo runs the scripted client of package democlient.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/examples/democlient"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "listen address")
	redisAddr := flag.String("redis", "", "Redis address (host:port); default: the in-memory store")
	demo := flag.Bool("demo", false, "serve on a free port, run a scripted client against it, and exit")
	flag.Parse()
	log.SetFlags(0)
	if err := run(*addr, *redisAddr, *demo); err != nil {
		log.Fatal(err)
	}
}

// run serves until SIGINT or SIGTERM (with demo, on a free port while the
// scripted client runs), then shuts down in the order a deploy needs.
func run(addr, redisAddr string, demo bool) error {
	var store storage.Store
	storeName := "memory"
	if redisAddr == "" {
		ms := memstore.New()
		defer ms.Close() // 3. the store, last
		store = ms
	} else {
		// ClientOptions: a request gets its 503 within about half a second
		// while Redis is unreachable.
		rdb := redis.NewClient(redisstore.ClientOptions(redisAddr))
		defer rdb.Close()
		store, storeName = redisstore.New(rdb), "redis "+redisAddr
	}
	if demo {
		addr = "127.0.0.1:0"
	}
	// democlient's Clicks lets ?slow=1 show a double click, for -demo and
	// for examples/client, which drives this server.
	h, m, err := newServer(store, os.Stderr, democlient.NewClicks())
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)

	var failed error
	if demo {
		failed = democlient.Play(os.Stdout, "http://"+ln.Addr().String(), democlient.RunID())
	} else {
		log.Printf("listening on http://%s (store: %s); try:\n  curl -i -X POST http://%[1]s/orders -H 'Content-Type: application/json' -H 'Idempotency-Key: order-1' -d '{\"item\":\"book\",\"amount\":12}'", ln.Addr(), storeName)
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		<-ctx.Done()
		stop()
	}
	// 1. the server: no new request, the handlers return; 2. idem: every
	// record stored, background retries included; 3. the store (deferred).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return errors.Join(failed, srv.Shutdown(ctx), m.Shutdown(ctx))
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
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Use(middleware.RequestLogger(), middleware.Recover(), echoidem.Middleware(m))
	e.POST("/orders", func(c echo.Context) error {
		var in struct {
			Item   string `json:"item"`
			Amount int    `json:"amount"`
		}
		if err := c.Bind(&in); err != nil {
			return echo.NewHTTPError(http.StatusBadRequest, "bad JSON")
		}
		clicks.Hold(c.Request()) // ?slow=1 waits for its duplicate's 409 (democlient)
		n := orders.Add(1)
		c.Response().Header().Set("Location", fmt.Sprintf("/orders/%d", n))
		return c.JSON(http.StatusCreated, map[string]any{"order": n, "item": in.Item, "amount": in.Amount, "handler_runs": n})
	})
	return e, m, nil
}
