package idemotel

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/storage"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the name of the instrumentation scope of the meter and the
// tracer that idemotel uses; Version is the scope's version.
const (
	ScopeName = "github.com/idemkit/idem/idemotel"
	Version   = "0.1.0"
)

// Names of the attributes idemotel sets.
const (
	attrOutcome    = attribute.Key("idem.outcome")
	attrReplayed   = attribute.Key("idem.replayed")
	attrMethod     = attribute.Key("http.request.method")
	attrRoute      = attribute.Key("http.route")
	attrOperation  = attribute.Key("idem.operation")
	attrStatus     = attribute.Key("http.response.status_code")
	attrRetries    = attribute.Key("idem.retries")
	attrStore      = attribute.Key("idem.store")
	attrStoreOp    = attribute.Key("idem.store.operation")
	attrStorageKey = attribute.Key("idem.storage_key")
	attrErrorType  = attribute.Key("error.type")
)

// Buckets of the histograms, in seconds: a handler's, from 5 ms to 10 s
// (OpenTelemetry's advice for HTTP durations); a store call's, from 50 µs
// (a memory store, Redis on loopback) to 5 s (a store timing out).
var (
	handlerBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	storeBuckets   = []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}
)

// maxRoutes bounds the attribute sets Observe keeps: those of the first
// maxRoutes routes and operations it sees. Routes are patterns, so this
// is more than an application has, unless a handler that is not a mux
// reports URL paths as routes (see idem.Event.Route).
const maxRoutes = 1000

// unsetGlobal is OpenTelemetry's global tracer provider as it is before a
// program sets one (otel.SetTracerProvider): a provider whose tracers make
// spans that record nothing, until a provider is set, to which they then
// hand over. It is nil if a provider was set before this package was
// initialized.
var unsetGlobal = func() trace.TracerProvider {
	tp := otel.GetTracerProvider()
	if t := reflect.TypeOf(tp); t.Kind() != reflect.Pointer || t.Elem().PkgPath() != "go.opentelemetry.io/otel/internal/global" {
		return nil
	}
	return tp
}()

// traces reports whether store calls get spans: the tracer is not a no-op
// one, nor the global one while no program has set it.
func (t *Telemetry) traces() bool {
	return t.tracing && (!t.global || otel.GetTracerProvider() != unsetGlobal)
}

// Option configures [New].
type Option func(*config) error

type config struct {
	mp        metric.MeterProvider
	tp        trace.TracerProvider
	storeName string
}

// WithMeterProvider sets the provider of the meter. Default: the global
// one, otel.GetMeterProvider(), as it is when New is called. A nil
// provider makes New return an error.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error {
		if mp == nil {
			return errors.New("idemotel: WithMeterProvider(nil)")
		}
		c.mp = mp
		return nil
	}
}

// WithTracerProvider sets the provider of the tracer. Default: the global
// one, otel.GetTracerProvider(), as it is when New is called; when no
// program has set one yet, the store's spans start once one is set
// (otel.SetTracerProvider). A no-op provider
// (go.opentelemetry.io/otel/trace/noop) turns the store's spans off. A
// nil provider makes New return an error.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) error {
		if tp == nil {
			return errors.New("idemotel: WithTracerProvider(nil)")
		}
		c.tp = tp
		return nil
	}
}

// WithStoreName sets the idem.store attribute of every store that
// [Telemetry.Store] wraps, such as "redis-orders". Default: the kind of
// the store, from its Go type: "memory" (memstore), "redis" (redisstore),
// "postgres" (pgstore), or "custom" for any other. An empty name makes New
// return an error.
func WithStoreName(name string) Option {
	return func(c *config) error {
		if name == "" {
			return errors.New(`idemotel: WithStoreName("")`)
		}
		c.storeName = name
		return nil
	}
}

// Telemetry reports idem's decisions and its store's calls to an
// OpenTelemetry meter and tracer. Make one with [New] and share it: it is
// safe for concurrent use, by any number of middlewares and stores.
type Telemetry struct {
	tracer    trace.Tracer
	tracing   bool   // the tracer is not a no-op one
	global    bool   // the tracer is the global provider's, and it was unset
	storeName string // WithStoreName's; "" derives it from the store

	requests   metric.Int64Counter
	handler    metric.Float64Histogram
	storeCalls metric.Float64Histogram
	leasesLost metric.Int64Counter
	retries    metric.Int64Counter

	routes  sync.Map     // routeKey -> *routeSets
	nRoutes atomic.Int32 // entries of routes

	mu      sync.Mutex
	watched map[*watch]struct{} // the middlewares Watch was given
}

// New returns a Telemetry that makes its instruments on the meter
// provider's meter and its spans with the tracer provider's tracer (see
// the options for the defaults). It returns an error when an option is
// invalid, or when the meter refuses an instrument or the callback of
// idem.executions.active.
func New(opts ...Option) (*Telemetry, error) {
	var c config
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	t := &Telemetry{storeName: c.storeName, watched: make(map[*watch]struct{})}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
		t.global = unsetGlobal != nil && c.tp == unsetGlobal
	}
	t.tracer = c.tp.Tracer(ScopeName, trace.WithInstrumentationVersion(Version))
	_, noop := c.tp.(tracenoop.TracerProvider)
	t.tracing = !noop

	meter := c.mp.Meter(ScopeName, metric.WithInstrumentationVersion(Version))
	var errs [6]error
	t.requests, errs[0] = meter.Int64Counter("idem.requests", metric.WithUnit("{request}"),
		metric.WithDescription("Protected requests and calls of Do, by outcome."))
	t.handler, errs[1] = meter.Float64Histogram("idem.handler.duration", metric.WithUnit("s"),
		metric.WithDescription("How long the handler, or Do's function, ran."),
		metric.WithExplicitBucketBoundaries(handlerBuckets...))
	t.storeCalls, errs[2] = meter.Float64Histogram("idem.store.operation.duration", metric.WithUnit("s"),
		metric.WithDescription("How long each call of the idempotency store took."),
		metric.WithExplicitBucketBoundaries(storeBuckets...))
	t.leasesLost, errs[3] = meter.Int64Counter("idem.leases.lost", metric.WithUnit("{lease}"),
		metric.WithDescription("Executions that outlived their lease while another request took the key."))
	t.retries, errs[4] = meter.Int64Counter("idem.completion.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Background retries of storing a result or releasing a key after the store failed."))
	active, err := meter.Int64ObservableUpDownCounter("idem.executions.active", metric.WithUnit("{execution}"),
		metric.WithDescription("Executions under way in this process: handlers running and results being stored."))
	if err == nil {
		_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			o.ObserveInt64(active, t.inFlight())
			return nil
		}, active)
	}
	errs[5] = err
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("idemotel: %w", err)
	}
	return t, nil
}

// Middleware returns idem.New(t.Store(store), opts...) with
// idem.WithObserver(t.Observe) before opts, watched (see [Telemetry.Watch])
// for as long as the middleware is in use. It returns idem.New's errors
// (for a nil store, an invalid option). An idem.WithObserver among opts
// replaces t's observer, as the last WithObserver does: it must then call
// t.Observe itself, or nothing is counted.
func (t *Telemetry) Middleware(store storage.Store, opts ...idem.Option) (*idem.Middleware, error) {
	if store == nil {
		return idem.New(nil) // idem's error for a nil store
	}
	m, err := idem.New(t.Store(store), append([]idem.Option{idem.WithObserver(t.Observe)}, opts...)...)
	if err != nil {
		return nil, err
	}
	t.Watch(m)
	return m, nil
}

// watch is a middleware that idem.executions.active counts. It holds
// the middleware weakly, so that one that is no longer in use is not kept
// for the observation's sake.
type watch struct{ m weak.Pointer[idem.Middleware] }

// Watch counts m's executions under way (m.InFlight) in
// idem.executions.active, until unwatch is called or m is no longer in
// use (t does not keep m alive). Each middleware is counted once per call
// of Watch. A nil m is ignored.
func (t *Telemetry) Watch(m *idem.Middleware) (unwatch func()) {
	if m == nil {
		return func() {}
	}
	w := &watch{m: weak.Make(m)}
	t.mu.Lock()
	t.watched[w] = struct{}{}
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		delete(t.watched, w)
		t.mu.Unlock()
	}
}

// inFlight returns the executions under way in the watched middlewares,
// and forgets those no longer in use.
func (t *Telemetry) inFlight() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var n int64
	for w := range t.watched {
		m := w.m.Value()
		if m == nil {
			delete(t.watched, w)
			continue
		}
		n += int64(m.InFlight())
	}
	return n
}

// Observe records one decision of a middleware: pass it as
// idem.WithObserver(tel.Observe), or call it from an observer of your own
// (a middleware has one observer: the last WithObserver given to idem.New).
// It counts the request in idem.requests; records the handler's duration
// when the handler ran; counts a lost lease and the completion's retries;
// and, when the request's context (ev.Context) holds a span that is
// recording, sets idem.outcome and idem.replayed on it and adds the event
// "idem.decision". It is safe for concurrent use and, after the first
// request of each route, allocates nothing of its own but the attributes
// of a recording span.
func (t *Telemetry) Observe(ev idem.Event) {
	ctx := ev.Context
	if ctx == nil {
		ctx = context.Background()
	}
	rs := t.routeSets(ev.Method, ev.Route)
	out := rs.outcome(ev.Outcome)
	t.requests.Add(ctx, 1, out.add...)
	if ev.Handler > 0 {
		t.handler.Record(ctx, ev.Handler.Seconds(), out.record...)
	}
	if ev.Outcome == idem.LeaseLost {
		t.leasesLost.Add(ctx, 1, rs.route.add...)
	}
	if ev.Retries > 0 {
		t.retries.Add(ctx, int64(ev.Retries), out.add...)
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attrOutcome.String(ev.Outcome.String()), attrReplayed.Bool(ev.Outcome == idem.Replayed))
		attrs := []attribute.KeyValue{attrOutcome.String(ev.Outcome.String()), attrRetries.Int(ev.Retries)}
		if ev.Method != "" && ev.Status != 0 {
			attrs = append(attrs, attrStatus.Int(ev.Status))
		}
		span.AddEvent("idem.decision", trace.WithAttributes(attrs...))
	}
}

// measurement is the options of a measurement with one attribute set,
// made once so that a measurement allocates nothing.
type measurement struct {
	add    []metric.AddOption
	record []metric.RecordOption
}

func newMeasurement(attrs ...attribute.KeyValue) measurement {
	o := metric.WithAttributeSet(attribute.NewSet(attrs...))
	return measurement{add: []metric.AddOption{o}, record: []metric.RecordOption{o}}
}

// routeKey names a route of a request (method and route) or an operation
// of Do (method "").
type routeKey struct{ method, route string }

// routeSets is the measurements of one route: without the outcome
// (idem.leases.lost) and with each outcome.
type routeSets struct {
	route    measurement
	outcomes [numOutcomes]measurement // by idem.Outcome; 0 unused
	attrs    []attribute.KeyValue     // of route
}

// numOutcomes bounds the idem.Outcome values that routeSets holds; an
// outcome of a later idem outside it gets its set made per request.
const numOutcomes = 16

func newRouteSets(method, route string) *routeSets {
	rs := &routeSets{attrs: routeAttrs(method, route)}
	rs.route = newMeasurement(rs.attrs...)
	for o := range rs.outcomes {
		if o > 0 {
			rs.outcomes[o] = newMeasurement(append(rs.attrs, attrOutcome.String(idem.Outcome(o).String()))...)
		}
	}
	return rs
}

// routeAttrs returns the attributes of a route: a request's method and
// route, or Do's operation.
func routeAttrs(method, route string) []attribute.KeyValue {
	if method == "" {
		return []attribute.KeyValue{attrOperation.String(route)}
	}
	return []attribute.KeyValue{attrMethod.String(method), attrRoute.String(route)}
}

// outcome returns the measurement of the route with outcome o.
func (rs *routeSets) outcome(o idem.Outcome) measurement {
	if o > 0 && int(o) < len(rs.outcomes) {
		return rs.outcomes[o]
	}
	return newMeasurement(append(rs.attrs[:len(rs.attrs):len(rs.attrs)], attrOutcome.String(o.String()))...)
}

// routeSets returns the measurements of a route, kept for the first
// maxRoutes routes.
func (t *Telemetry) routeSets(method, route string) *routeSets {
	k := routeKey{method, route}
	if v, ok := t.routes.Load(k); ok {
		return v.(*routeSets)
	}
	rs := newRouteSets(method, route)
	if t.nRoutes.Load() >= maxRoutes {
		return rs
	}
	v, loaded := t.routes.LoadOrStore(k, rs)
	if !loaded {
		t.nRoutes.Add(1)
	}
	return v.(*routeSets)
}
