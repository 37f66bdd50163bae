package idemotel_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/memstore"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// A service instrumented in one line: the order, then its retry, counted
// in idem.requests by outcome. A real program gives New its exporter's
// meter provider (or sets the global one); the manual reader here shows
// what an exporter would get.
func ExampleTelemetry_Middleware() {
	reader := sdkmetric.NewManualReader()
	tel, err := idemotel.New(idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		log.Fatal(err)
	}
	store := memstore.New()
	defer store.Close()
	m, err := tel.Middleware(store, idem.WithTTL(time.Hour))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Idempotency-Key", "order-1")
		mux.ServeHTTP(httptest.NewRecorder(), req)
	}

	var rm metricdata.ResourceMetrics
	reader.Collect(context.Background(), &rm)
	for _, mt := range rm.ScopeMetrics[0].Metrics {
		if mt.Name != "idem.requests" {
			continue
		}
		for _, p := range mt.Data.(metricdata.Sum[int64]).DataPoints {
			route, _ := p.Attributes.Value("http.route")
			outcome, _ := p.Attributes.Value("idem.outcome")
			fmt.Printf("%s %s %s: %d\n", mt.Name, route.AsString(), outcome.AsString(), p.Value)
		}
	}
	// Unordered output:
	// idem.requests /orders executed: 1
	// idem.requests /orders replayed: 1
}

// An observer of your own, which logs the decisions that need a look,
// and hands every one to the Telemetry: a middleware has a single
// observer.
func ExampleTelemetry_Observe() {
	tel, err := idemotel.New() // the global providers
	if err != nil {
		log.Fatal(err)
	}
	logger := slog.Default()
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(tel.Store(store), idem.WithObserver(func(ev idem.Event) {
		tel.Observe(ev)
		if ev.Outcome == idem.StoreError || ev.Outcome == idem.LeaseLost {
			logger.ErrorContext(ev.Context, "idem", "outcome", ev.Outcome.String(), "route", ev.Route, "err", ev.Err)
		}
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer tel.Watch(m)() // idem.executions.active counts m until it returns
	// ... serve with m, then m.Shutdown
}
