package idemotel_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"go.opentelemetry.io/otel/attribute"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// TestMain fails the run if a test leaves a goroutine behind (a lease
// heartbeat, a background retry, a store's janitor).
func TestMain(m *testing.M) { leakcheck.Main(m) }

// rig is an order service on the memory store, instrumented by idemotel
// with the SDK's providers: a manual metric reader and a span recorder.
// Each request runs in a server span of its own, as otelhttp makes one.
type rig struct {
	t      *testing.T
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tracer trace.Tracer
	tel    *idemotel.Telemetry
	m      *idem.Middleware
	h      http.Handler

	mu      sync.Mutex
	held    map[string]chan struct{} // by X-Hold value: the handler waits for its close
	entered chan string              // a held handler's X-Hold value, when it starts waiting
	runs    int                      // handler runs
}

// newRig serves POST /orders protected by a middleware on store (a memory
// store when nil), made with tel.Middleware and opts. The handler answers
// 201 with the body it got, or 500 when the request has X-Fail; a request
// with X-Hold: name waits in the handler until release(name).
func newRig(t *testing.T, store storage.Store, opts ...idem.Option) *rig {
	t.Helper()
	return newRigWith(t, store, nil, opts...)
}

// newRigWith is newRig with idemotel's options telOpts.
func newRigWith(t *testing.T, store storage.Store, telOpts []idemotel.Option, opts ...idem.Option) *rig {
	t.Helper()
	r := &rig{t: t, reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder(),
		held: make(map[string]chan struct{}), entered: make(chan string, 16)}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	t.Cleanup(func() {
		mp.Shutdown(context.Background())
		tp.Shutdown(context.Background())
	})
	r.tracer = tp.Tracer("test")
	if store == nil {
		ms := memstore.New()
		t.Cleanup(func() { ms.Close() })
		store = ms
	}
	var err error
	telOpts = append([]idemotel.Option{idemotel.WithMeterProvider(mp), idemotel.WithTracerProvider(tp)}, telOpts...)
	if r.tel, err = idemotel.New(telOpts...); err != nil {
		t.Fatal(err)
	}
	if r.m, err = r.tel.Middleware(store, opts...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.m.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", nethttp.Middleware(r.m)(http.HandlerFunc(r.serve)))
	r.h = r.traced(mux)
	return r
}

// traced runs each request in a server span, as otelhttp does.
func (r *rig) traced(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		ctx, span := r.tracer.Start(req.Context(), "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		next.ServeHTTP(w, req.WithContext(ctx))
	})
}

// serve is the application's handler.
func (r *rig) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.runs++
	r.mu.Unlock()
	if name := req.Header.Get("X-Hold"); name != "" {
		ch := r.hold(name)
		r.entered <- name
		<-ch
	}
	if req.Header.Get("X-Fail") != "" {
		http.Error(w, "failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(body)
}

// hold returns the channel that a handler held under name waits for.
func (r *rig) hold(name string) chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch, ok := r.held[name]
	if !ok {
		ch = make(chan struct{})
		r.held[name] = ch
	}
	return ch
}

// release lets the handler held under name go on.
func (r *rig) release(name string) { close(r.hold(name)) }

// handlerRuns returns how many times the handler ran.
func (r *rig) handlerRuns() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs
}

// send sends POST /orders with key (no header when "") and body, with the
// extra headers given as name, value pairs, and returns the answer.
func (r *rig) send(key, body string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	r.h.ServeHTTP(w, req)
	return w
}

// sendHeld sends a request held under name in the background and returns
// once its handler runs; wait returns its answer.
func (r *rig) sendHeld(key, body, name string) (wait func() *httptest.ResponseRecorder) {
	r.t.Helper()
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- r.send(key, body, "X-Hold", name) }()
	select {
	case got := <-r.entered:
		if got != name {
			r.t.Fatalf("handler %q entered, want %q", got, name)
		}
	case w := <-done:
		r.t.Fatalf("the held request returned %d before its handler ran: %s", w.Code, w.Body)
	case <-time.After(10 * time.Second):
		r.t.Fatal("the held request's handler did not run within 10s")
	}
	return func() *httptest.ResponseRecorder { return <-done }
}

// collect reads the metrics.
func (r *rig) collect() metrics {
	r.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		r.t.Fatal(err)
	}
	var ms metrics
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != idemotel.ScopeName || sm.Scope.Version != idemotel.Version {
			r.t.Errorf("scope %q %q, want %q %q", sm.Scope.Name, sm.Scope.Version, idemotel.ScopeName, idemotel.Version)
		}
		ms = append(ms, sm.Metrics...)
	}
	return ms
}

// metrics is what a collection read.
type metrics []metricdata.Metrics

// named returns the metric called name, failing t when there is none.
func (ms metrics) named(t *testing.T, name string) metricdata.Metrics {
	t.Helper()
	for _, m := range ms {
		if m.Name == name {
			return m
		}
	}
	t.Fatalf("no metric %s among %v", name, ms.names())
	return metricdata.Metrics{}
}

func (ms metrics) names() []string {
	var names []string
	for _, m := range ms {
		names = append(names, m.Name)
	}
	return names
}

// attrs is a set of attributes as name=value strings, for comparisons.
func attrs(set attribute.Set) string {
	var kv []string
	for _, a := range set.ToSlice() {
		kv = append(kv, string(a.Key)+"="+a.Value.String())
	}
	slices.Sort(kv)
	return strings.Join(kv, " ")
}

// sums returns the points of a counter (or up-down counter) by their
// attributes.
func sums(t *testing.T, m metricdata.Metrics) map[string]int64 {
	t.Helper()
	s, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s is a %T, not a Sum[int64]", m.Name, m.Data)
	}
	got := make(map[string]int64)
	for _, p := range s.DataPoints {
		got[attrs(p.Attributes)] += p.Value
	}
	return got
}

// counts returns the number of measurements of a histogram by their
// attributes.
func counts(t *testing.T, m metricdata.Metrics) map[string]uint64 {
	t.Helper()
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%s is a %T, not a Histogram[float64]", m.Name, m.Data)
	}
	got := make(map[string]uint64)
	for _, p := range h.DataPoints {
		got[attrs(p.Attributes)] += p.Count
	}
	return got
}

// allAttributes returns every attribute value of the metrics and of the
// ended spans (their events' too), with span names and statuses, each as
// "where: key=value".
func (r *rig) allAttributes() []string {
	var all []string
	add := func(where string, kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			all = append(all, fmt.Sprintf("%s: %s=%s", where, kv.Key, kv.Value.String()))
		}
	}
	for _, m := range r.collect() {
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, p := range d.DataPoints {
				add(m.Name, p.Attributes.ToSlice())
			}
		case metricdata.Histogram[float64]:
			for _, p := range d.DataPoints {
				add(m.Name, p.Attributes.ToSlice())
			}
		default:
			all = append(all, fmt.Sprintf("%s: unexpected data %T", m.Name, d))
		}
	}
	for _, s := range r.spans.Ended() {
		all = append(all, "span name: "+s.Name(), "span status: "+s.Status().Description)
		add("span "+s.Name(), s.Attributes())
		for _, e := range s.Events() {
			all = append(all, "event name: "+e.Name)
			add("event "+e.Name, e.Attributes)
		}
	}
	return all
}

// failing is a memory store whose calls can be made to fail.
type failing struct {
	*memstore.Store
	mu       sync.Mutex
	acquire  error // Acquire's error, when not nil
	complete []error
	keys     []string // the keys Acquire was given
}

func newFailing(t *testing.T) *failing {
	ms := memstore.New()
	t.Cleanup(func() { ms.Close() })
	return &failing{Store: ms}
}

// failAcquire makes Acquire return err (nil: succeed).
func (f *failing) failAcquire(err error) {
	f.mu.Lock()
	f.acquire = err
	f.mu.Unlock()
}

// failComplete makes the next calls of Complete return errs, one each.
func (f *failing) failComplete(errs ...error) {
	f.mu.Lock()
	f.complete = append(f.complete, errs...)
	f.mu.Unlock()
}

func (f *failing) Acquire(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	f.mu.Lock()
	err := f.acquire
	f.keys = append(f.keys, key)
	f.mu.Unlock()
	if err != nil {
		return storage.Result{}, err
	}
	return f.Store.Acquire(ctx, key, owner, fingerprint, lease)
}

func (f *failing) Complete(ctx context.Context, key, owner string, record []byte, ttl time.Duration) error {
	f.mu.Lock()
	var err error
	if len(f.complete) > 0 {
		err, f.complete = f.complete[0], f.complete[1:]
	}
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.Store.Complete(ctx, key, owner, record, ttl)
}

// acquired returns the keys Acquire was given.
func (f *failing) acquired() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.keys)
}

// noopTelemetry returns a Telemetry on no-op providers.
func noopTelemetry(t testing.TB) *idemotel.Telemetry {
	t.Helper()
	tel, err := idemotel.New(idemotel.WithMeterProvider(metricnoop.NewMeterProvider()),
		idemotel.WithTracerProvider(tracenoop.NewTracerProvider()))
	if err != nil {
		t.Fatal(err)
	}
	return tel
}
