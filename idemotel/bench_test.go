package idemotel_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"unsafe"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/memstore"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// The budget for idemotel on the memory store with no-op
// providers, per request, over the same request without idemotel: at
// most 2 allocations (and under 1 µs, which BenchmarkOverhead measures
// and no test asserts).
const budgetAllocs = 2

// stack is how a benchmark's middleware is made.
type stack struct {
	name string
	// middleware returns the middleware on store, and the context a
	// request runs in.
	middleware func(tb testing.TB, store *memstore.Store) (*idem.Middleware, context.Context)
}

var stacks = []stack{
	{"idem", func(tb testing.TB, store *memstore.Store) (*idem.Middleware, context.Context) {
		m, err := idem.New(store)
		if err != nil {
			tb.Fatal(err)
		}
		return m, context.Background()
	}},
	{"noop", func(tb testing.TB, store *memstore.Store) (*idem.Middleware, context.Context) {
		return telemetryMiddleware(tb, noopTelemetry(tb), store), context.Background()
	}},
	// The SDK's providers: a meter read by nobody, a tracer that samples
	// every span and exports none; each request runs in a server span,
	// as behind otelhttp.
	{"sdk", func(tb testing.TB, store *memstore.Store) (*idem.Middleware, context.Context) {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		tp := sdktrace.NewTracerProvider()
		tb.Cleanup(func() {
			mp.Shutdown(context.Background())
			tp.Shutdown(context.Background())
		})
		tel, err := idemotel.New(idemotel.WithMeterProvider(mp), idemotel.WithTracerProvider(tp))
		if err != nil {
			tb.Fatal(err)
		}
		ctx, span := tp.Tracer("bench").Start(context.Background(), "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
		tb.Cleanup(func() { span.End() })
		return telemetryMiddleware(tb, tel, store), ctx
	}},
}

func telemetryMiddleware(tb testing.TB, tel *idemotel.Telemetry, store *memstore.Store) *idem.Middleware {
	m, err := tel.Middleware(store)
	if err != nil {
		tb.Fatal(err)
	}
	return m
}

// orderJSON is the handler's answer, as in the kit's own benchmarks
// (internal/tests/bench): 201, three headers and a 200-byte body.
var orderJSON = []byte(`{"id":42,"status":"created","customer":"c_8d2f","items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"total":{"amount":"129.90","currency":"EUR"},"created_at":"2026-11-22T20:20:00Z","note":"at door"}`)

// requestJSON is the body of every request.
var requestJSON = []byte(`{"customer":"c_8d2f","items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}]}`)

// benchClient sends POST /orders through a middleware on the memory store,
// reusing its request, body and writer, so that only the middleware and
// the handler are measured.
type benchClient struct {
	h    http.Handler
	r    *http.Request
	body bytes.Reader
	w    *recorder
	key  []byte
	n    uint64
}

// newBenchClient mounts the stack's middleware on a memory store.
func newBenchClient(tb testing.TB, s stack) *benchClient {
	store := memstore.New()
	tb.Cleanup(func() { store.Close() })
	m, ctx := s.middleware(tb, store)
	tb.Cleanup(func() { m.Shutdown(context.Background()) })
	mux := http.NewServeMux()
	mux.Handle("POST /orders", nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Location", "/orders/42")
		h.Set("X-Request-Id", "2f1c7a9e-6f7d-4a8e-9f55-0d3c1b2a4e6f")
		w.WriteHeader(http.StatusCreated)
		w.Write(orderJSON)
	})))
	c := &benchClient{h: mux, w: &recorder{h: make(http.Header)}, key: []byte("order-0")}
	c.r = httptest.NewRequestWithContext(ctx, http.MethodPost, "/orders", nil)
	c.r.Header.Set("Content-Type", "application/json")
	c.r.Header.Set("Authorization", "Bearer 7f3a0c21")
	c.r = c.r.WithContext(idem.ContextWithPrincipal(c.r.Context(), "user-7f3a")) // as the authentication would
	c.r.Header.Set("Idempotency-Key", string(c.key))
	return c
}

// next makes the key "order-<n>" for the next n, without allocating: the
// header value is the key's buffer, which the middleware does not keep.
func (c *benchClient) next() {
	c.n++
	c.key = strconv.AppendUint(c.key[:len("order-")], c.n, 10)
	c.r.Header["Idempotency-Key"][0] = unsafe.String(&c.key[0], len(c.key))
}

// send sends the request once and returns its status and whether it was
// replayed.
func (c *benchClient) send() {
	clear(c.w.h)
	c.w.status = 0
	c.body.Reset(requestJSON)
	c.r.Body, c.r.ContentLength = io.NopCloser(&c.body), int64(len(requestJSON))
	c.h.ServeHTTP(c.w, c.r)
}

// first sends a request with a new key, replay one with the key of the
// last.
func (c *benchClient) first()  { c.next(); c.send() }
func (c *benchClient) replay() { c.send() }

// ok reports whether the last answer is the expected one.
func (c *benchClient) ok(replayed bool) bool {
	return c.w.status == http.StatusCreated && (c.w.h.Get("Idempotent-Replayed") == "true") == replayed
}

// recorder is the cheapest ResponseWriter: it keeps the status.
type recorder struct {
	h      http.Header
	status int
}

func (r *recorder) Header() http.Header { return r.h }
func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return len(p), nil
}

// BenchmarkOverhead measures a first execution and a replay through
// nethttp on the memory store, without idemotel (idem), with it on no-op
// providers (noop, the budget's case) and on the SDK's (sdk, for
// information):
//
//	go test -run '^$' -bench Overhead -count 5 ./idemotel/
func BenchmarkOverhead(b *testing.B) {
	for _, s := range stacks {
		b.Run(s.name, func(b *testing.B) {
			b.Run("first", func(b *testing.B) {
				c := newBenchClient(b, s)
				b.ReportAllocs()
				for b.Loop() {
					c.first()
				}
				if !c.ok(false) {
					b.Fatalf("got %d", c.w.status)
				}
			})
			b.Run("replay", func(b *testing.B) {
				c := newBenchClient(b, s)
				c.first()
				b.ReportAllocs()
				for b.Loop() {
					c.replay()
				}
				if !c.ok(true) {
					b.Fatalf("got %d, not replayed", c.w.status)
				}
			})
		})
	}
}

// TestAllocationBudget holds idemotel on no-op providers to the budget:
// at most budgetAllocs allocations per request over the same request
// without it, for a first execution and a replay.
func TestAllocationBudget(t *testing.T) {
	if raceEnabled {
		t.Skip("allocations are not measured under the race detector")
	}
	for _, replay := range []bool{false, true} {
		bare, with := allocsPerRequest(t, stacks[0], replay), allocsPerRequest(t, stacks[1], replay)
		t.Logf("replay %v: %v allocations without idemotel, %v with (no-op providers)", replay, bare, with)
		if with-bare > budgetAllocs {
			t.Errorf("replay %v: idemotel adds %v allocations per request, budget %d", replay, with-bare, budgetAllocs)
		}
	}
}

// allocsPerRequest returns the allocations of a first execution (or a
// replay) through the stack's middleware, after one that warms up (the
// route's attribute sets are made).
func allocsPerRequest(t *testing.T, s stack, replay bool) float64 {
	t.Helper()
	c := newBenchClient(t, s)
	c.first()
	send := c.first
	if replay {
		send = c.replay
	}
	n := testing.AllocsPerRun(200, send)
	if !c.ok(replay) {
		t.Fatalf("%s: got %d (replay %v)", s.name, c.w.status, replay)
	}
	return n
}
