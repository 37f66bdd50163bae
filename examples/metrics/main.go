// Command metrics is the order endpoint of examples/nethttp with idem's
// metrics: idemotel reports idem's decisions and its store's calls to an
// OpenTelemetry meter, exported in Prometheus's format on GET /metrics.
//
//	go run ./examples/metrics                  # serve on localhost:8080, memory store
//	go run ./examples/metrics -redis localhost:6379
//	go run ./examples/metrics -demo            # serve on a free port, send an order, a duplicate and a retry, print the metrics, exit
//
//	POST /orders   -> 201 and the order (an Idempotency-Key makes its retries safe)
//	GET  /metrics  -> idem_requests_total{idem_outcome="executed",http_route="/orders",...},
//	                  idem_handler_duration_seconds, idem_store_operation_duration_seconds,
//	                  idem_executions_active, idem_leases_lost_total, idem_completion_retries_total
//
// Traces go to OpenTelemetry's global tracer provider: a service that
// exports traces sets one (otel.SetTracerProvider) before idemotel.New,
// and wraps its handlers in otelhttp, whose request spans idemotel
// annotates.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/democlient"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "listen address")
	redisAddr := flag.String("redis", "", "Redis address (host:port); default: the in-memory store")
	demo := flag.Bool("demo", false, "serve on a free port, send an order, a duplicate and a retry, print the metrics, and exit")
	flag.Parse()
	log.SetFlags(0)
	if err := run(*addr, *redisAddr, *demo); err != nil {
		log.Fatal(err)
	}
}

// run serves until SIGINT or SIGTERM (with demo, on a free port while the
// demo runs), then shuts down in the order a deploy needs.
func run(addr, redisAddr string, demo bool) error {
	var store storage.Store
	if redisAddr == "" {
		ms := memstore.New()
		defer ms.Close() // 3. the store, last
		store = ms
	} else {
		rdb := redis.NewClient(redisstore.ClientOptions(redisAddr))
		defer rdb.Close()
		store = redisstore.New(rdb)
	}
	if demo {
		addr = "127.0.0.1:0"
	}
	// democlient's Clicks holds a request with ?slow=1 until its duplicate
	// got 409, so that the demo shows a conflict on any machine.
	h, m, err := newServer(store, democlient.NewClicks())
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
		failed = play(os.Stdout, "http://"+ln.Addr().String(), democlient.RunID())
	} else {
		log.Printf("listening on http://%s; metrics on http://%[1]s/metrics; try:\n  curl -i -X POST http://%[1]s/orders -H 'Content-Type: application/json' -H 'Idempotency-Key: order-1' -d '{\"item\":\"book\",\"amount\":12}'", ln.Addr())
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

// newServer builds the application on store: the protected order
// endpoint, instrumented by idemotel, and its metrics on GET /metrics.
// clicks is the demo's hook (nil: none; see package democlient). It
// returns the middleware too, for its Shutdown.
func newServer(store storage.Store, clicks *democlient.Clicks) (http.Handler, *idem.Middleware, error) {
	// The metrics go to a registry of the server's own: a program with a
	// single server may keep the exporter's default, the global registry.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, err
	}
	tel, err := idemotel.New(idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))))
	if err != nil {
		return nil, nil, err
	}
	// tel.Middleware is idem.New with tel's observer and store wrapper;
	// an idem.WithObserver of your own would replace the observer, and
	// must then call tel.Observe.
	m, err := tel.Middleware(store,
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
		json.NewEncoder(w).Encode(map[string]any{"order": n, "item": in.Item, "amount": in.Amount})
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", nethttp.Middleware(m)(create))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux, m, nil
}
