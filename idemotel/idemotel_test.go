package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/internal/testclock"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// The attributes of the rig's route, and of the outcomes on it.
const (
	route    = "http.request.method=POST http.route=/orders"
	executed = "http.request.method=POST http.route=/orders idem.outcome=executed"
	replayed = "http.request.method=POST http.route=/orders idem.outcome=replayed"
)

// outcome returns the attributes of the rig's route with outcome o.
func outcome(o string) string { return route + " idem.outcome=" + o }

// storeCall returns the attributes of a call of op on a memory store,
// failed with class (none when "").
func storeCall(op, class string) string { return storeCallOn("memory", op, class) }

// storeCallOn returns the attributes of a call of op on the store named
// store, failed with class (none when "").
func storeCallOn(store, op, class string) string {
	s := "idem.store.operation=" + op + " idem.store=" + store
	if class != "" {
		s = "error.type=" + class + " " + s
	}
	return s
}

// TestOutcomes: each decision is counted under its outcome, with the
// request's method and route; the handler's duration is recorded for the
// requests that ran it, and only those.
func TestOutcomes(t *testing.T) {
	r := newRig(t, nil)
	if w := r.send("order-1", `{"item":"book"}`); w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	if w := r.send("order-1", `{"item":"book"}`); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d, not replayed", w.Code)
	}
	if w := r.send("order-1", `{"item":"pen"}`); w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("same key, another body: %d, want 422", w.Code)
	}
	if w := r.send("bad key\x01", `{}`); w.Code != http.StatusBadRequest {
		t.Fatalf("bad key: %d, want 400", w.Code)
	}
	if w := r.send("order-2", `{}`, "X-Fail", "1"); w.Code != http.StatusInternalServerError {
		t.Fatalf("failing handler: %d, want 500", w.Code)
	}
	// A duplicate while the first runs.
	wait := r.sendHeld("order-3", `{}`, "first")
	if w := r.send("order-3", `{}`); w.Code != http.StatusConflict {
		t.Fatalf("duplicate: %d, want 409", w.Code)
	}
	r.release("first")
	if w := wait(); w.Code != http.StatusCreated {
		t.Fatalf("held: %d", w.Code)
	}

	ms := r.collect()
	want := map[string]int64{
		executed: 2, replayed: 1, outcome("mismatch"): 1, outcome("rejected"): 1,
		outcome("released"): 1, outcome("conflict"): 1,
	}
	if got := sums(t, ms.named(t, "idem.requests")); !maps.Equal(got, want) {
		t.Errorf("idem.requests:\n got %v\nwant %v", got, want)
	}
	// The handler ran for the executions and the released request.
	wantRuns := map[string]uint64{executed: 2, outcome("released"): 1}
	if got := counts(t, ms.named(t, "idem.handler.duration")); !maps.Equal(got, wantRuns) {
		t.Errorf("idem.handler.duration counts:\n got %v\nwant %v", got, wantRuns)
	}
	if n := r.handlerRuns(); n != 3 {
		t.Errorf("the handler ran %d times, want 3", n)
	}
	// Store calls: an acquire for each request that reached the store (not
	// the rejected one), a complete per execution, a release for the 500.
	wantCalls := map[string]uint64{storeCall("acquire", ""): 6, storeCall("complete", ""): 2, storeCall("release", ""): 1}
	if got := counts(t, ms.named(t, "idem.store.operation.duration")); !maps.Equal(got, wantCalls) {
		t.Errorf("idem.store.operation.duration counts:\n got %v\nwant %v", got, wantCalls)
	}
}

// TestStoreError: a store that fails gives the outcome store-error, and
// its call is recorded with error.type, its span with status Error.
func TestStoreError(t *testing.T) {
	f := newFailing(t)
	r := newRig(t, f)
	f.failAcquire(errors.New("dial tcp 127.0.0.1:6379: connection refused"))
	if w := r.send("order-1", `{}`); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("got %d, want 503", w.Code)
	}
	f.failAcquire(context.DeadlineExceeded)
	r.send("order-2", `{}`)
	// After an Acquire that failed, which may have taken the key all the
	// same, the middleware releases it in the background: Shutdown waits.
	if err := r.m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	ms := r.collect()
	if got, want := sums(t, ms.named(t, "idem.requests")), map[string]int64{outcome("store-error"): 2}; !maps.Equal(got, want) {
		t.Errorf("idem.requests: got %v, want %v", got, want)
	}
	// The default store name is the memory store's: a failing embeds one,
	// but is a type of its own.
	want := map[string]uint64{storeCallOn("custom", "acquire", "other"): 1, storeCallOn("custom", "acquire", "timeout"): 1,
		storeCallOn("custom", "release", ""): 2}
	if got := counts(t, ms.named(t, "idem.store.operation.duration")); !maps.Equal(got, want) {
		t.Errorf("idem.store.operation.duration: got %v, want %v", got, want)
	}
	for _, s := range r.spans.Ended() {
		if s.Name() != "idem.store acquire" {
			continue
		}
		if s.Status().Code != codes.Error || (s.Status().Description != "other" && s.Status().Description != "timeout") {
			t.Errorf("span %s: status %v %q, want Error with the error's class", s.Name(), s.Status().Code, s.Status().Description)
		}
	}
}

// TestStoreCalls calls every method of a wrapped memory store, each
// once as the store answers it and once failed, and checks its duration
// is recorded under its operation, with error.type when it failed; the
// spans of answers (not_owner, exists, not_found) keep an unset status,
// the others' is Error.
func TestStoreCalls(t *testing.T) {
	r := newRig(t, nil)
	ms := memstore.New()
	defer ms.Close()
	s := r.tel.Store(ms)
	iss, ins := s.(storage.Issuer), s.(storage.Inspector)
	ctx := context.Background()
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	const lease, ttl = time.Minute, time.Hour
	calls := []struct {
		op, class string
		call      func() error
	}{
		{"acquire", "", func() error { _, err := s.Acquire(ctx, "k1", "o1", "fp", lease); return err }},
		{"acquire", "invalid", func() error { _, err := s.Acquire(ctx, "", "o1", "fp", lease); return err }},
		{"extend", "", func() error { return s.Extend(ctx, "k1", "o1", lease) }},
		{"extend", "not_owner", func() error { return s.Extend(ctx, "k1", "o2", lease) }},
		{"complete", "", func() error { return s.Complete(ctx, "k1", "o1", []byte("record"), ttl) }},
		{"complete", "invalid", func() error { return s.Complete(ctx, "k1", "o1", nil, 0) }},
		{"release", "", func() error { return s.Release(ctx, "k9", "o1") }},
		{"release", "not_owner", func() error { return s.Release(ctx, "k1", "o2") }},
		{"issue", "", func() error { return iss.Issue(ctx, "k2", ttl) }},
		{"issue", "exists", func() error { return iss.Issue(ctx, "k2", ttl) }},
		{"acquire_issued", "", func() error { _, err := iss.AcquireIssued(ctx, "k2", "o3", "fp", lease); return err }},
		{"acquire_issued", "invalid", func() error { _, err := iss.AcquireIssued(ctx, "k2", "", "fp", lease); return err }},
		{"lookup", "", func() error { _, err := ins.Lookup(ctx, "k1", false); return err }},
		{"lookup", "not_found", func() error { _, err := ins.Lookup(ctx, "k8", false); return err }},
		{"list", "", func() error { _, err := ins.List(ctx, storage.Query{}); return err }},
		{"list", "invalid", func() error { _, err := ins.List(ctx, storage.Query{State: storage.Acquired}); return err }},
		{"remove", "changed", func() error { _, err := ins.Remove(ctx, "k1", "not-its-version"); return err }},
		{"remove", "", func() error {
			e, err := ms.Lookup(ctx, "k1", false) // not counted: the store itself
			if err == nil {
				_, err = ins.Remove(ctx, "k1", e.Version)
			}
			return err
		}},
		{"remove", "not_found", func() error { _, err := ins.Remove(ctx, "k1", "any"); return err }},
	}
	want := make(map[string]uint64)
	wantStatus := make(map[string]codes.Code)
	for _, c := range calls {
		err := c.call()
		if (err != nil) != (c.class != "") {
			t.Fatalf("%s: error %v, want class %q", c.op, err, c.class)
		}
		want[storeCall(c.op, c.class)]++
		status := codes.Unset
		if c.class == "invalid" {
			status = codes.Error
		}
		wantStatus[c.op+" "+c.class] = status
	}
	// A context's error is classed by its kind (timeout: TestStoreError):
	// a memory store never looks at its context, so a store of the test's
	// returns it.
	if _, err := r.tel.Store(ctxErrStore{ms}).Acquire(canceled, "k5", "o5", "", lease); err == nil {
		t.Fatal("no error from a canceled context")
	}
	want[storeCallOn("custom", "acquire", "canceled")]++
	if got := counts(t, r.collect().named(t, "idem.store.operation.duration")); !maps.Equal(got, want) {
		t.Errorf("idem.store.operation.duration:\n got %v\nwant %v", got, want)
	}
	for _, sp := range r.spans.Ended() {
		op := strings.TrimPrefix(sp.Name(), "idem.store ")
		class := ""
		for _, kv := range sp.Attributes() {
			if kv.Key == "error.type" {
				class = kv.Value.AsString()
			}
		}
		if class == "canceled" {
			if sp.Status().Code != codes.Error {
				t.Errorf("span %s %s: status %v, want Error", op, class, sp.Status().Code)
			}
			continue
		}
		if w, ok := wantStatus[op+" "+class]; !ok || sp.Status().Code != w {
			t.Errorf("span %s %s: status %v, want %v (known: %v)", op, class, sp.Status().Code, w, ok)
		}
		if sp.SpanKind() != trace.SpanKindClient {
			t.Errorf("span %s: kind %v, want client", sp.Name(), sp.SpanKind())
		}
	}
}

// ctxErrStore is a store that returns its context's error, as a network
// store does.
type ctxErrStore struct{ storage.Store }

func (s ctxErrStore) Acquire(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	if err := ctx.Err(); err != nil {
		return storage.Result{}, err
	}
	return s.Store.Acquire(ctx, key, owner, fingerprint, lease)
}

// TestSpans: the store's spans are children of the request's span, which
// gets idem.outcome, idem.replayed and the idem.decision event.
func TestSpans(t *testing.T) {
	r := newRig(t, nil)
	r.send("order-1", `{}`)
	r.send("order-1", `{}`)
	var requests []sdktrace.ReadOnlySpan
	children := make(map[trace.SpanID][]string)
	for _, s := range r.spans.Ended() {
		if s.Name() == "POST /orders" {
			requests = append(requests, s)
			continue
		}
		children[s.Parent().SpanID()] = append(children[s.Parent().SpanID()], s.Name())
	}
	if len(requests) != 2 {
		t.Fatalf("%d request spans, want 2", len(requests))
	}
	for i, want := range []struct {
		outcome  string
		replayed bool
		stores   []string
	}{
		{"executed", false, []string{"idem.store acquire", "idem.store complete"}},
		{"replayed", true, []string{"idem.store acquire"}},
	} {
		s := requests[i]
		got := make(map[string]string)
		for _, kv := range s.Attributes() {
			got[string(kv.Key)] = kv.Value.String()
		}
		if got["idem.outcome"] != want.outcome || got["idem.replayed"] != map[bool]string{true: "true", false: "false"}[want.replayed] {
			t.Errorf("request %d: attributes %v, want idem.outcome=%s idem.replayed=%v", i, got, want.outcome, want.replayed)
		}
		if kids := children[s.SpanContext().SpanID()]; strings.Join(kids, ",") != strings.Join(want.stores, ",") {
			t.Errorf("request %d: children %v, want %v", i, kids, want.stores)
		}
		if ev := s.Events(); len(ev) != 1 || ev[0].Name != "idem.decision" {
			t.Errorf("request %d: events %v, want idem.decision", i, ev)
		} else {
			ea := make(map[string]string)
			for _, kv := range ev[0].Attributes {
				ea[string(kv.Key)] = kv.Value.String()
			}
			if ea["http.response.status_code"] != "201" || ea["idem.retries"] != "0" || ea["idem.outcome"] != want.outcome {
				t.Errorf("request %d: idem.decision %v", i, ea)
			}
		}
	}
	for _, s := range r.spans.Ended() {
		if strings.HasPrefix(s.Name(), "idem.store ") {
			got := make(map[string]string)
			for _, kv := range s.Attributes() {
				got[string(kv.Key)] = kv.Value.String()
			}
			if got["idem.store"] != "memory" || got["idem.storage_key"] == "" || !strings.HasSuffix(s.Name(), got["idem.store.operation"]) {
				t.Errorf("span %s: attributes %v", s.Name(), got)
			}
		}
	}
}

// TestNoClientKey: no attribute, span name, status or event of any
// outcome holds the client's key, nor a body.
func TestNoClientKey(t *testing.T) {
	const key, body = "order-Zq7XsecretKEY", `{"card":"4111-BODYSECRET"}`
	f := newFailing(t)
	r := newRig(t, f, idem.WithLease(time.Second))
	r.send(key, body)
	r.send(key, body)
	r.send(key, `{"other":"BODYSECRET2"}`)
	wait := r.sendHeld(key+"b", body, "first")
	r.send(key+"b", body)
	r.release("first")
	wait()
	f.failComplete(errors.New("store down for " + key)) // a store's error quoting what it got
	r.send(key+"c", body)
	f.failAcquire(errors.New("store down for " + key))
	r.send(key+"d", body)
	f.failAcquire(nil)
	if err := r.m.Shutdown(context.Background()); err != nil { // the retried completion
		t.Fatal(err)
	}
	all := r.allAttributes()
	if len(all) < 20 {
		t.Fatalf("only %d attributes: %v", len(all), all)
	}
	for _, a := range all {
		if strings.Contains(a, "secret") || strings.Contains(a, "SECRET") || strings.Contains(a, "store down") {
			t.Errorf("an attribute holds the client's key, a body or an error's text: %s", a)
		}
	}
}

// TestDoOperation: a call of Do is counted under its operation.
func TestDoOperation(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	for range 2 {
		if _, err := r.m.Do(ctx, "charge", "msg-1", func(context.Context) ([]byte, error) { return []byte("ok"), nil }); err != nil {
			t.Fatal(err)
		}
	}
	ms := r.collect()
	want := map[string]int64{"idem.operation=charge idem.outcome=executed": 1, "idem.operation=charge idem.outcome=replayed": 1}
	if got := sums(t, ms.named(t, "idem.requests")); !maps.Equal(got, want) {
		t.Errorf("idem.requests: got %v, want %v", got, want)
	}
	wantRuns := map[string]uint64{"idem.operation=charge idem.outcome=executed": 1}
	if got := counts(t, ms.named(t, "idem.handler.duration")); !maps.Equal(got, wantRuns) {
		t.Errorf("idem.handler.duration: got %v, want %v", got, wantRuns)
	}
}

// TestCompletionRetries: a completion that the store refuses twice is
// retried in the background; the retries are counted with the outcome
// they ended with.
func TestCompletionRetries(t *testing.T) {
	f := newFailing(t)
	r := newRigWith(t, f, []idemotel.Option{idemotel.WithStoreName("orders")}, idem.WithLease(10*time.Second))
	f.failComplete(errors.New("connection reset"), errors.New("connection reset"))
	if w := r.send("order-1", `{}`); w.Code != http.StatusCreated {
		t.Fatalf("got %d", w.Code)
	}
	// Shutdown makes the retries go at once, and waits for them.
	if err := r.m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	ms := r.collect()
	if got, want := sums(t, ms.named(t, "idem.completion.retries")), map[string]int64{executed: 2}; !maps.Equal(got, want) {
		t.Errorf("idem.completion.retries: got %v, want %v", got, want)
	}
	if got, want := sums(t, ms.named(t, "idem.requests")), map[string]int64{executed: 1}; !maps.Equal(got, want) {
		t.Errorf("idem.requests: got %v, want %v", got, want)
	}
	want := map[string]uint64{
		storeCallOn("orders", "acquire", ""):       1,
		storeCallOn("orders", "complete", "other"): 2,
		storeCallOn("orders", "complete", ""):      1,
	}
	if got := counts(t, ms.named(t, "idem.store.operation.duration")); !maps.Equal(got, want) {
		t.Errorf("idem.store.operation.duration: got %v, want %v", got, want)
	}
}

// TestLeaseLost: a handler that outlives its lease, while a duplicate
// takes the key, is counted in idem.leases.lost.
func TestLeaseLost(t *testing.T) {
	clock := testclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	ms := memstore.New(memstore.WithClock(clock.Now))
	defer ms.Close()
	r := newRig(t, ms)
	wait := r.sendHeld("order-1", `{}`, "first")
	clock.Advance(idem.DefaultLease + time.Second) // the first's lease runs out
	if w := r.send("order-1", `{}`); w.Code != http.StatusCreated {
		t.Fatalf("duplicate after the lease: %d, want 201", w.Code)
	}
	r.release("first")
	wait()
	ms2 := r.collect()
	if got, want := sums(t, ms2.named(t, "idem.leases.lost")), map[string]int64{route: 1}; !maps.Equal(got, want) {
		t.Errorf("idem.leases.lost: got %v, want %v", got, want)
	}
	if got, want := sums(t, ms2.named(t, "idem.requests")), map[string]int64{executed: 1, outcome("lease-lost"): 1}; !maps.Equal(got, want) {
		t.Errorf("idem.requests: got %v, want %v", got, want)
	}
}

// TestExecutionsActive: idem.executions.active counts the handlers
// running in the watched middlewares.
func TestExecutionsActive(t *testing.T) {
	r := newRig(t, nil)
	active := func() map[string]int64 { return sums(t, r.collect().named(t, "idem.executions.active")) }
	if got := active(); got[""] != 0 {
		t.Errorf("idle: %v, want 0", got)
	}
	wait1 := r.sendHeld("order-1", `{}`, "one")
	wait2 := r.sendHeld("order-2", `{}`, "two")
	if got := active(); got[""] != 2 {
		t.Errorf("two handlers running: %v, want 2", got)
	}
	r.release("one")
	wait1()
	if got := active(); got[""] != 1 {
		t.Errorf("one handler running: %v, want 1", got)
	}

	// A second middleware, watched by hand, adds its own; unwatched, it
	// no longer counts.
	ms2 := memstore.New()
	defer ms2.Close()
	m2, err := idem.New(r.tel.Store(ms2), idem.WithObserver(r.tel.Observe))
	if err != nil {
		t.Fatal(err)
	}
	unwatch := r.tel.Watch(m2)
	started, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := m2.Do(context.Background(), "job", "j1", func(context.Context) ([]byte, error) {
			close(started)
			<-finish
			return nil, nil
		})
		done <- err
	}()
	<-started
	if got := active(); got[""] != 2 {
		t.Errorf("a handler and a Do running: %v, want 2", got)
	}
	unwatch()
	if got := active(); got[""] != 1 {
		t.Errorf("after unwatch: %v, want 1", got)
	}
	close(finish)
	if err := <-done; err != nil {
		t.Error(err)
	}
	r.release("two")
	wait2()
	if got := active(); got[""] != 0 {
		t.Errorf("all done: %v, want 0", got)
	}
}

// TestOptionalInterfaces: the wrapper is a storage.Issuer and a
// storage.Inspector exactly when its store is.
func TestOptionalInterfaces(t *testing.T) {
	tel := noopTelemetry(t)
	ms := memstore.New()
	defer ms.Close()
	for _, c := range []struct {
		name              string
		store             storage.Store
		issuer, inspector bool
	}{
		{"memstore", ms, true, true},
		{"plain", struct{ storage.Store }{ms}, false, false},
		{"issuer", struct{ storage.Issuer }{ms}, true, false},
		{"inspector", struct{ storage.Inspector }{ms}, false, true},
	} {
		s := tel.Store(c.store)
		_, iss := s.(storage.Issuer)
		_, ins := s.(storage.Inspector)
		if iss != c.issuer || ins != c.inspector {
			t.Errorf("%s: wrapper is Issuer %v, Inspector %v; want %v, %v", c.name, iss, ins, c.issuer, c.inspector)
		}
		_, err := idem.New(s, idem.WithIssuedKeys(0))
		if (err == nil) != c.issuer {
			t.Errorf("%s: WithIssuedKeys: %v", c.name, err)
		}
	}
	if tel.Store(nil) != nil {
		t.Error("Store(nil) is not nil")
	}
}

// TestIssuedKeys: WithIssuedKeys works through the wrapper.
func TestIssuedKeys(t *testing.T) {
	r := newRig(t, nil, idem.WithIssuedKeys(time.Minute))
	if w := r.send("made-up", `{}`); w.Code != http.StatusBadRequest {
		t.Fatalf("a key never issued: %d, want 400", w.Code)
	}
	key, err := r.m.IssueKey(httptest.NewRequest(http.MethodGet, "/form", nil))
	if err != nil {
		t.Fatal(err)
	}
	if w := r.send(key, `{}`); w.Code != http.StatusCreated {
		t.Fatalf("an issued key: %d, want 201", w.Code)
	}
	want := map[string]uint64{storeCall("issue", ""): 1, storeCall("acquire_issued", ""): 2, storeCall("complete", ""): 1}
	if got := counts(t, r.collect().named(t, "idem.store.operation.duration")); !maps.Equal(got, want) {
		t.Errorf("idem.store.operation.duration: got %v, want %v", got, want)
	}
}

// TestLeaseInContext: the storage.Lease in a handler's context names the
// entry by the key the store itself was given, so a fence on the store
// (pgstore's Fence) finds its entry through the wrapper.
func TestLeaseInContext(t *testing.T) {
	f := newFailing(t)
	tel := noopTelemetry(t)
	m, err := tel.Middleware(f)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown(context.Background())
	var lease storage.Lease
	mux := http.NewServeMux()
	mux.Handle("POST /orders", nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lease, _ = storage.LeaseFromContext(r.Context())
		w.WriteHeader(http.StatusCreated)
	})))
	req := httptest.NewRequest(http.MethodPost, "/orders", nil)
	req.Header.Set("Idempotency-Key", "order-1")
	mux.ServeHTTP(httptest.NewRecorder(), req)
	keys := f.acquired()
	if len(keys) != 1 || lease.Key != keys[0] || lease.Owner == "" {
		t.Errorf("lease %+v, store given %v", lease, keys)
	}
	// The entry the lease names is the request's, done.
	e, err := f.Lookup(context.Background(), lease.Key, false)
	if err != nil || e.State != storage.Done {
		t.Errorf("the lease's entry: %+v %v", e, err)
	}
}

// TestNew: invalid options are refused.
func TestNew(t *testing.T) {
	for _, o := range []idemotel.Option{idemotel.WithMeterProvider(nil), idemotel.WithTracerProvider(nil), idemotel.WithStoreName("")} {
		if _, err := idemotel.New(o); err == nil {
			t.Error("no error")
		}
	}
	tel := noopTelemetry(t)
	if _, err := tel.Middleware(nil); !errors.Is(err, idem.ErrInvalidOption) {
		t.Errorf("Middleware(nil): %v", err)
	}
	ms := memstore.New()
	defer ms.Close()
	if _, err := tel.Middleware(ms, idem.WithTTL(-1)); !errors.Is(err, idem.ErrInvalidOption) {
		t.Errorf("Middleware with an invalid option: %v", err)
	}
	tel.Watch(nil)() // ignored
}

// TestGlobalProviders: without options, New uses the global providers.
func TestGlobalProviders(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	// The global provider stays set: every other test gives its own.
	otel.SetMeterProvider(mp)
	tel, err := idemotel.New()
	if err != nil {
		t.Fatal(err)
	}
	tel.Observe(idem.Event{Outcome: idem.Executed, Method: "POST", Route: "/x", Context: context.Background()})
	r := &rig{t: t, reader: reader}
	if got := sums(t, r.collect().named(t, "idem.requests")); got["http.request.method=POST http.route=/x idem.outcome=executed"] != 1 {
		t.Errorf("idem.requests: %v", got)
	}
}

// TestManyRoutes: routes past the ones whose attribute sets are kept are
// counted all the same.
func TestManyRoutes(t *testing.T) {
	r := newRig(t, nil)
	const routes = 1200
	for i := range routes {
		for range 2 {
			r.tel.Observe(idem.Event{Outcome: idem.Executed, Method: "POST", Route: fmt.Sprintf("/r%d", i), Context: context.Background()})
		}
	}
	got := sums(t, r.collect().named(t, "idem.requests"))
	if len(got) != routes {
		t.Fatalf("%d series, want %d", len(got), routes)
	}
	for i := range routes {
		if k := fmt.Sprintf("http.request.method=POST http.route=/r%d idem.outcome=executed", i); got[k] != 2 {
			t.Errorf("%s: %d, want 2", k, got[k])
		}
	}
}

// globalSpans records the spans of the global tracer provider, once
// TestGlobalTracer has set it: the global provider is the test binary's,
// set once for every run of the test (-count).
var (
	globalSpans = tracetest.NewSpanRecorder()
	setGlobal   sync.Once
)

// TestGlobalTracer: without WithTracerProvider, the store's spans go to
// the global provider. While no program has set it, they are not made at
// all (the first run of the test checks that they cost no allocation);
// once it is set, they are, by a Telemetry made before as after.
func TestGlobalTracer(t *testing.T) {
	newTel := func() *idemotel.Telemetry {
		tel, err := idemotel.New(idemotel.WithMeterProvider(metricnoop.NewMeterProvider()))
		if err != nil {
			t.Fatal(err)
		}
		return tel
	}
	before := newTel()
	setGlobal.Do(func() {
		if !raceEnabled {
			unset := stack{"unset global", func(tb testing.TB, store *memstore.Store) (*idem.Middleware, context.Context) {
				return telemetryMiddleware(tb, before, store), context.Background()
			}}
			for _, replay := range []bool{false, true} {
				bare, with := allocsPerRequest(t, stacks[0], replay), allocsPerRequest(t, unset, replay)
				if with-bare > budgetAllocs {
					t.Errorf("replay %v: %v allocations over idem's %v with the unset global tracer, budget %d", replay, with, bare, budgetAllocs)
				}
			}
		}
		otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(globalSpans)))
	})
	for i, tel := range []*idemotel.Telemetry{before, newTel()} {
		ms := memstore.New()
		defer ms.Close()
		s := tel.Store(ms)
		key := fmt.Sprintf("global-%d-%d", time.Now().UnixNano(), i)
		if _, err := s.Acquire(context.Background(), key, "o1", "", time.Minute); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, sp := range globalSpans.Ended() {
			for _, kv := range sp.Attributes() {
				found = found || (kv.Key == "idem.storage_key" && kv.Value.AsString() == key)
			}
		}
		if !found {
			t.Errorf("Telemetry %d: no span of the global provider for its call", i)
		}
	}
}
