package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testclock"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
)

// hookStore wraps a store; each hook, when set, replaces the call.
type hookStore struct {
	storage.Store
	acquire  func(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error)
	complete func(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error
	release  func(ctx context.Context, key, owner string) error
	extended chan time.Duration // gets each successful Extend's lease, if not nil
	extends  atomic.Int64       // Extend calls
}

func (s *hookStore) Acquire(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
	if s.acquire != nil {
		return s.acquire(ctx, key, owner, fp, lease)
	}
	return s.Store.Acquire(ctx, key, owner, fp, lease)
}

func (s *hookStore) Complete(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
	if s.complete != nil {
		return s.complete(ctx, key, owner, rec, ttl)
	}
	return s.Store.Complete(ctx, key, owner, rec, ttl)
}

func (s *hookStore) Release(ctx context.Context, key, owner string) error {
	if s.release != nil {
		return s.release(ctx, key, owner)
	}
	return s.Store.Release(ctx, key, owner)
}

func (s *hookStore) Extend(ctx context.Context, key, owner string, lease time.Duration) error {
	s.extends.Add(1)
	err := s.Store.Extend(ctx, key, owner, lease)
	if err == nil && s.extended != nil {
		s.extended <- lease
	}
	return err
}

// newMemStore returns a memory store on a fake clock, closed at the end of
// the test.
func newMemStore(t *testing.T) (*memstore.Store, *testclock.Clock) {
	clk := testclock.New(time.Unix(1_700_000_000, 0))
	s := memstore.New(memstore.WithClock(clk.Now))
	t.Cleanup(func() { s.Close() })
	return s, clk
}

// serve sends a POST with key and body through h and returns the recorder.
func serve(h http.Handler, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestHeartbeatKeepsLease runs a handler for four times its lease on the
// store's clock: the renewals every lease/3 keep the key locked, so a
// duplicate still gets 409 instead of running the handler a second time.
func TestHeartbeatKeepsLease(t *testing.T) {
	const lease = 300 * time.Millisecond
	mem, clk := newMemStore(t)
	store := &hookStore{Store: mem, extended: make(chan time.Duration, 16)}
	m, err := idem.New(store, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	entered, proceed := make(chan struct{}), make(chan struct{})
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(entered)
			<-proceed
		}
		w.WriteHeader(http.StatusCreated)
	}))

	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- serve(h, "k", "") }()
	<-entered
	// After each renewal the store's clock moves half a lease: four
	// renewals take it two leases past the first one's expiry.
	for range 4 {
		if got := <-store.extended; got != lease {
			t.Fatalf("Extend with lease %v, want %v", got, lease)
		}
		clk.Advance(lease / 2)
	}
	dup := serve(h, "k", "")
	if dup.Code != http.StatusConflict {
		t.Fatalf("duplicate while the handler runs past its first lease: %d %s", dup.Code, dup.Body)
	}
	close(proceed)
	if w := <-first; w.Code != http.StatusCreated {
		t.Fatalf("first: %d", w.Code)
	}
	if w := serve(h, "k", ""); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after completion: %d %v", w.Code, w.Header())
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// TestCorruptRecordNotReexecuted: a stored record that cannot be decoded
// gets 500 and is reported; the handler does not run again.
func TestCorruptRecordNotReexecuted(t *testing.T) {
	mem, _ := newMemStore(t)
	var fp string
	store := &hookStore{Store: mem}
	store.acquire = func(ctx context.Context, key, owner, f string, lease time.Duration) (storage.Result, error) {
		fp = f
		return storage.Result{State: storage.Done, Fingerprint: f, Record: []byte{0x7f, 'x'}}, nil
	}
	var events []idem.Event
	m, err := idem.New(store, idem.WithObserver(func(e idem.Event) { events = append(events, e) }))
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	h := nethttp.Middleware(m)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true }))
	w := serve(h, "k", "{}")
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "ErrCorruptRecord") {
		t.Fatalf("corrupt record: %d %s", w.Code, w.Body)
	}
	if ran || fp == "" {
		t.Fatalf("handler ran %v, fingerprint %q", ran, fp)
	}
	if len(events) != 1 || events[0].Outcome != idem.StoreError || !errors.Is(events[0].Err, idem.ErrCorruptRecord) {
		t.Fatalf("events %+v", events)
	}
}

// TestCompleteFailureReported: when the store keeps failing after the
// handler, the client still gets the handler's response, the middleware
// retries for one lease, then tells the observer.
func TestCompleteFailureReported(t *testing.T) {
	mem, _ := newMemStore(t)
	down := errors.New("store went away")
	var attempts atomic.Int32
	store := &hookStore{Store: mem, complete: func(context.Context, string, string, []byte, time.Duration) error {
		attempts.Add(1)
		return down
	}}
	events := make(chan idem.Event, 1)
	m, err := idem.New(store, idem.WithLease(100*time.Millisecond), idem.WithObserver(func(e idem.Event) { events <- e }))
	if err != nil {
		t.Fatal(err)
	}
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	if w := serve(h, "k", ""); w.Code != http.StatusCreated || w.Body.String() != "made" {
		t.Fatalf("client got %d %q", w.Code, w.Body)
	}
	got := <-events
	if got.Outcome != idem.StoreError || !errors.Is(got.Err, down) || got.Status != http.StatusCreated {
		t.Fatalf("event %+v", got)
	}
	if n := attempts.Load(); n < 3 {
		t.Fatalf("Complete tried %d times within the lease, want a few", n)
	}
}

// TestCompleteRetriedAfterStoreFailure: a store that fails for a moment
// after the handler (a Redis blip shorter than the lease) still gets the
// record, so a retry replays instead of running the handler again.
func TestCompleteRetriedAfterStoreFailure(t *testing.T) {
	for _, tc := range []struct {
		name    string
		release bool // the response is not cacheable: Release is retried
	}{{"complete", false}, {"release", true}} {
		t.Run(tc.name, func(t *testing.T) {
			mem, _ := newMemStore(t)
			down := errors.New("blip")
			var fails atomic.Int32
			fails.Store(2)
			store := &hookStore{Store: mem}
			store.complete = func(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
				if fails.Add(-1) >= 0 {
					return down
				}
				return mem.Complete(ctx, key, owner, rec, ttl)
			}
			store.release = func(ctx context.Context, key, owner string) error {
				if fails.Add(-1) >= 0 {
					return down
				}
				return mem.Release(ctx, key, owner)
			}
			events := make(chan idem.Event, 4)
			m, err := idem.New(store, idem.WithObserver(func(e idem.Event) { events <- e }))
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int32
			h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				if tc.release && n == 1 {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "made")
			}))
			first := serve(h, "k", "")
			ev := <-events // once the retries succeeded
			want := idem.Executed
			if tc.release {
				want = idem.Released
			}
			if ev.Outcome != want || ev.Err != nil {
				t.Fatalf("event %+v, want %v", ev, want)
			}
			retry := serve(h, "k", "")
			if tc.release {
				// Released: the retry runs the handler again.
				if first.Code != 503 || retry.Code != 201 || runs.Load() != 2 {
					t.Fatalf("first %d, retry %d, runs %d", first.Code, retry.Code, runs.Load())
				}
				return
			}
			if retry.Code != 201 || retry.Body.String() != "made" || retry.Header().Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
				t.Fatalf("retry %d %q %v, runs %d", retry.Code, retry.Body, retry.Header(), runs.Load())
			}
		})
	}
}

// TestWaitGivesUp: with WithWait, a duplicate waits for the first request;
// when the wait ends first, it gets the usual 409.
func TestWaitGivesUp(t *testing.T) {
	mem, _ := newMemStore(t)
	m, err := idem.New(mem, idem.WithWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	entered, proceed := make(chan struct{}), make(chan struct{})
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-proceed
	}))
	done := make(chan struct{})
	go func() { defer close(done); serve(h, "k", "") }()
	<-entered
	w := serve(h, "k", "")
	close(proceed)
	<-done
	if w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
		t.Fatalf("duplicate after its wait: %d %v", w.Code, w.Header())
	}
}

// TestRetryAfterEstimate: the 409's Retry-After estimates when the request
// in flight will be done from how long the route's handler took on its
// recent runs (the 90th percentile), in whole seconds rounded up, at least
// 1 and at most the lease left. On today's main it was always the lease
// left: 30 s for a handler of 0.3 s.
func TestRetryAfterEstimate(t *testing.T) {
	for _, tc := range []struct {
		name string
		runs []time.Duration // the route's handler durations before the 409
		left time.Duration   // the lease the request in flight has left
		want string
	}{
		{"no run yet", nil, 30 * time.Second, "1"},
		{"fast handler", []time.Duration{300 * time.Millisecond, 200 * time.Millisecond}, 30 * time.Second, "1"},
		{"slow handler", []time.Duration{2500 * time.Millisecond, 2 * time.Second, 2100 * time.Millisecond}, 30 * time.Second, "3"},
		{"90th percentile", append(repeat(9, time.Second), 20*time.Second), 30 * time.Second, "1"},
		{"90th percentile of many", append(repeat(20, time.Second), repeat(12, 7*time.Second)...), 30 * time.Second, "7"},
		{"at most the lease left", []time.Duration{20 * time.Second}, 4500 * time.Millisecond, "5"},
		{"at least a second", []time.Duration{20 * time.Second}, time.Millisecond, "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memstore.New()
				defer mem.Close()
				store := &hookStore{Store: mem}
				store.acquire = func(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
					res, err := mem.Acquire(ctx, key, owner, fp, lease)
					if err == nil && res.State == storage.Done {
						// The key is taken: report it in flight, as a
						// duplicate would find it on another instance.
						return storage.Result{State: storage.InFlight, Fingerprint: fp, LeaseLeft: tc.left}, nil
					}
					return res, err
				}
				m, err := idem.New(store)
				if err != nil {
					t.Fatal(err)
				}
				var next time.Duration
				h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					time.Sleep(next) // the bubble's clock: no real wait
				}))
				for i, d := range tc.runs {
					next = d
					serve(h, fmt.Sprint("run-", i), "")
				}
				next = 0
				serve(h, "busy", "")
				w := serve(h, "busy", "")
				if w.Code != http.StatusConflict || w.Header().Get("Retry-After") != tc.want {
					t.Errorf("409 after runs %v with %v of lease left: %d Retry-After %q, want %s",
						tc.runs, tc.left, w.Code, w.Header().Get("Retry-After"), tc.want)
				}
			})
		})
	}
}

// TestRetryAfterFollowsNewRuns: the estimate, kept between 409s, follows
// the runs that come after it.
func TestRetryAfterFollowsNewRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New()
		defer mem.Close()
		var slow atomic.Bool
		m, err := idem.New(mem)
		if err != nil {
			t.Fatal(err)
		}
		hold := make(chan struct{})
		h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Idempotency-Key") == "held" {
				<-hold
				return
			}
			if slow.Load() {
				time.Sleep(5 * time.Second)
			} else {
				time.Sleep(time.Second)
			}
		}))
		go serve(h, "held", "")
		synctest.Wait()
		conflict := func() string {
			w := serve(h, "held", "")
			if w.Code != http.StatusConflict {
				t.Fatalf("duplicate of the held request: %d", w.Code)
			}
			return w.Header().Get("Retry-After")
		}
		for i := range recentRunsForTest {
			serve(h, fmt.Sprint("fast-", i), "")
		}
		if got := conflict(); got != "1" {
			t.Fatalf("after fast runs: Retry-After %q, want 1", got)
		}
		conflict() // the kept estimate
		slow.Store(true)
		for i := range recentRunsForTest {
			serve(h, fmt.Sprint("slow-", i), "")
		}
		if got := conflict(); got != "5" {
			t.Fatalf("after slow runs: Retry-After %q, want 5", got)
		}
		close(hold)
		synctest.Wait()
	})
}

// recentRunsForTest is how many runs fill the estimate's window.
const recentRunsForTest = 32

func repeat(n int, d time.Duration) []time.Duration {
	s := make([]time.Duration, n)
	for i := range s {
		s[i] = d
	}
	return s
}

// TestOptionsChangeBehaviour checks each option that is not covered by the
// conformance suite against what a client sees.
func TestOptionsChangeBehaviour(t *testing.T) {
	type step struct {
		method, key, body string
		header            http.Header
		status            int
		replayed          bool
	}
	cases := []struct {
		name    string
		opts    []idem.Option
		handler http.HandlerFunc
		steps   []step
		runs    int32
	}{
		{
			name:  "WithHeader",
			opts:  []idem.Option{idem.WithHeader("X-Request-Key")},
			steps: []step{{header: http.Header{"X-Request-Key": {"a"}}, status: 201}, {header: http.Header{"X-Request-Key": {"a"}}, status: 201, replayed: true}, {key: "a", status: 201}},
			runs:  2,
		},
		{
			name:  "WithMethods",
			opts:  []idem.Option{idem.WithMethods("PUT")},
			steps: []step{{method: "PUT", key: "a", status: 201}, {method: "PUT", key: "a", status: 201, replayed: true}, {method: "POST", key: "a", status: 201}, {method: "POST", key: "a", status: 201}},
			runs:  3,
		},
		{
			name:  "WithoutFingerprint",
			opts:  []idem.Option{idem.WithoutFingerprint()},
			steps: []step{{key: "a", body: "one", status: 201}, {key: "a", body: "two", status: 201, replayed: true}},
			runs:  1,
		},
		{
			name: "WithFingerprint",
			opts: []idem.Option{idem.WithFingerprint(func(r *http.Request, body []byte) string { return strings.ToLower(string(body)) })},
			steps: []step{{key: "a", body: "One", status: 201}, {key: "a", body: "ONE", status: 201, replayed: true},
				{key: "a", body: "two", status: 422}},
			runs: 1,
		},
		{
			name:    "WithCacheable",
			opts:    []idem.Option{idem.WithCacheable(func(status int) bool { return status == 201 })},
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusAccepted) },
			steps:   []step{{key: "a", status: 202}, {key: "a", status: 202}},
			runs:    2,
		},
		{
			name: "WithScope",
			opts: []idem.Option{idem.WithScope(func(r *http.Request) string { return r.Header.Get("X-Tenant") })},
			steps: []step{{key: "a", header: http.Header{"X-Tenant": {"t1"}}, status: 201},
				{key: "a", header: http.Header{"X-Tenant": {"t2"}}, status: 201},
				{key: "a", header: http.Header{"X-Tenant": {"t1"}, "Authorization": {"other"}}, status: 201, replayed: true}},
			runs: 2,
		},
		{
			name: "WithErrorWriter",
			opts: []idem.Option{idem.WithErrorWriter(func(w http.ResponseWriter, r *http.Request, e *idem.Error) {
				w.Header().Set("X-Error", e.Kind.Error())
				w.WriteHeader(e.Status)
			})},
			steps: []step{{key: "\x01", status: 400, header: http.Header{}}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mem, _ := newMemStore(t)
			m, err := idem.New(mem, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int32
			h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				if tc.handler != nil {
					tc.handler(w, r)
					return
				}
				w.WriteHeader(http.StatusCreated)
			}))
			for i, s := range tc.steps {
				if s.method == "" {
					s.method = http.MethodPost
				}
				r := httptest.NewRequest(s.method, "/orders", strings.NewReader(s.body))
				for k, v := range s.header {
					r.Header[k] = v
				}
				if s.key != "" {
					r.Header["Idempotency-Key"] = []string{s.key}
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != s.status || (w.Header().Get("Idempotent-Replayed") == "true") != s.replayed {
					t.Fatalf("step %d: %d replayed=%q, want %d replayed=%v (%s)", i, w.Code, w.Header().Get("Idempotent-Replayed"), s.status, s.replayed, w.Body)
				}
				if tc.name == "WithErrorWriter" && (w.Header().Get("X-Error") != idem.ErrInvalidKey.Error() || w.Body.Len() != 0) {
					t.Fatalf("custom error writer not used: %v %q", w.Header(), w.Body)
				}
			}
			if n := runs.Load(); n != tc.runs {
				t.Fatalf("handler ran %d times, want %d", n, tc.runs)
			}
		})
	}
}

// TestGoexitReleases: a handler that leaves through runtime.Goexit (as
// t.FailNow does) did not complete: its key is released, and the
// middleware does not turn the Goexit into a panic.
func TestGoexitReleases(t *testing.T) {
	mem, _ := newMemStore(t)
	var got idem.Event
	m, err := idem.New(mem, idem.WithObserver(func(e idem.Event) { got = e }))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			runtime.Goexit()
		}
		w.WriteHeader(http.StatusCreated)
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		serve(h, "k", "")
	}()
	<-done
	if got.Outcome != idem.Released || got.Err == nil {
		t.Fatalf("event after Goexit: %+v", got)
	}
	if w := serve(h, "k", ""); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after Goexit: %d %v", w.Code, w.Header())
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}

// TestHeartbeatRenewsOnlyWhileTheHandlerRuns, on synctest's clock: a
// handler shorter than lease/3 costs no renewal, a longer one is renewed
// every lease/3, and none after it returned.
func TestHeartbeatRenewsOnlyWhileTheHandlerRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New()
		defer mem.Close()
		s := &hookStore{Store: mem}
		m, err := idem.New(s, idem.WithLease(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(350 * time.Millisecond) // due at 100, 200 and 300 ms
			io.WriteString(w, "slow")
		}))
		quick := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		post := func(h http.Handler, key string) *httptest.ResponseRecorder {
			w := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, "/o", nil)
			r.Header.Set("Idempotency-Key", key)
			h.ServeHTTP(w, r)
			return w
		}
		for i := range 5 { // short handlers never renew
			post(quick, "quick"+string(rune('a'+i)))
		}
		if n := s.extends.Load(); n != 0 {
			t.Fatalf("%d renewals for handlers shorter than lease/3", n)
		}
		if w := post(h, "slow"); w.Body.String() != "slow" {
			t.Fatalf("slow handler: %d %q", w.Code, w.Body)
		}
		if n := s.extends.Load(); n != 3 {
			t.Fatalf("%d renewals during 350ms with a 300ms lease, want 3", n)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if n := s.extends.Load(); n != 3 {
			t.Fatalf("%d renewals after the handler returned, want still 3", n)
		}
		if w := post(h, "slow"); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("no replay after a renewed execution: %d", w.Code)
		}
	})
}

// valueKey is a context key of the test's own.
type valueKey struct{}

// TestFinishContext: the store call that ends an execution keeps the
// request's values, not its cancellation, is bounded by the lease, and is
// cancelled once it returned.
func TestFinishContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New()
		defer mem.Close()
		var done <-chan struct{}
		var ctxSeen context.Context
		s := &hookStore{Store: mem}
		s.complete = func(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
			ctxSeen = ctx
			if d, ok := ctx.Deadline(); !ok || time.Until(d) != time.Minute {
				t.Errorf("deadline %v %v, want the lease from now", d, ok)
			}
			if ctx.Value(valueKey{}) != "v" {
				t.Error("the request's values are lost")
			}
			done = ctx.Done()
			if ctx.Err() != nil {
				t.Errorf("Err %v before the deadline, with the client gone", ctx.Err())
			}
			if context.Cause(ctx) != nil {
				t.Errorf("Cause %v: the request's cancellation leaked in", context.Cause(ctx))
			}
			return mem.Complete(ctx, key, owner, rec, ttl)
		}
		m, _ := idem.New(s, idem.WithLease(time.Minute))
		rctx, cancel := context.WithCancel(context.WithValue(context.Background(), valueKey{}, "v"))
		h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cancel() // the client goes away before the finish
			io.WriteString(w, "x")
		}))
		r := httptest.NewRequestWithContext(rctx, http.MethodPost, "/o", strings.NewReader("body"))
		r.Header.Set("Idempotency-Key", "k")
		h.ServeHTTP(httptest.NewRecorder(), r)
		if ctxSeen == nil {
			t.Fatal("Complete was not called")
		}
		select {
		case <-done:
		default:
			t.Fatal("Done still open after the store call returned")
		}
		if !errors.Is(ctxSeen.Err(), context.Canceled) {
			t.Fatalf("Err after the call %v, want Canceled", ctxSeen.Err())
		}
	})
}

// failWriter fails every body write, as the writer of a client that went
// away does.
type failWriter struct{ *httptest.ResponseRecorder }

func (w failWriter) Write([]byte) (int, error) { return 0, errors.New("write: broken pipe") }

// A replay whose write fails is reported with the writer's error; on the
// main before this fix the event said replayed with a nil Err.
func TestReplayWriteErrorReported(t *testing.T) {
	mem, _ := newMemStore(t)
	var log eventLog
	m, err := idem.New(mem, idem.WithObserver(log.observe))
	if err != nil {
		t.Fatal(err)
	}
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		io.WriteString(w, "order 1")
	}))
	serve(h, "k", "")
	r := httptest.NewRequest(http.MethodPost, "/orders", nil)
	r.Header.Set("Idempotency-Key", "k")
	h.ServeHTTP(failWriter{httptest.NewRecorder()}, r)
	ev := log.ev[len(log.ev)-1]
	if ev.Outcome != idem.Replayed || ev.Err == nil || !strings.Contains(ev.Err.Error(), "broken pipe") {
		t.Fatalf("event %v %v, want replayed with the write's error", ev.Outcome, ev.Err)
	}
}

// An Acquire that fails after the store took the lease (a timeout while
// the answer was on its way) does not leave the key locked for a whole
// lease: the middleware releases its own attempt's lease, so the client's
// retry runs at once. On the main before this fix the retry got 409 until
// the lease ran out.
func TestFailedAcquireUnlocks(t *testing.T) {
	mem, _ := newMemStore(t)
	var timeouts atomic.Int64
	timeouts.Store(1)
	store := &hookStore{Store: mem, acquire: func(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
		res, err := mem.Acquire(ctx, key, owner, fp, lease)
		if timeouts.Add(-1) >= 0 {
			return storage.Result{}, fmt.Errorf("i/o timeout: %w", context.DeadlineExceeded)
		}
		return res, err
	}}
	m, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(201)
	}))
	if w := serve(h, "k", ""); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("first: %d, want 503", w.Code)
	}
	if err := m.Shutdown(context.Background()); err != nil { // waits for the release
		t.Fatal(err)
	}
	if w := serve(h, "k", ""); w.Code != 201 || runs.Load() != 1 {
		t.Fatalf("retry: %d %s, handler ran %d times; want 201 at once", w.Code, w.Body, runs.Load())
	}
}

// The release after a failed Acquire is retried, with backoff, while the
// store keeps failing it (a connection broken again and again): the key
// is freed once the store answers, not left locked for the rest of the
// lease. On the main before this fix the one Release sent was lost and
// the retry got 409.
func TestFailedAcquireUnlocksThroughFailingReleases(t *testing.T) {
	mem, _ := newMemStore(t)
	var failAcquire, failReleases, releases atomic.Int64
	failAcquire.Store(1)
	failReleases.Store(3)
	store := &hookStore{Store: mem,
		acquire: func(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
			res, err := mem.Acquire(ctx, key, owner, fp, lease)
			if failAcquire.Add(-1) >= 0 {
				return storage.Result{}, errors.New("read: connection reset by peer")
			}
			return res, err
		},
		release: func(ctx context.Context, key, owner string) error {
			releases.Add(1)
			if failReleases.Add(-1) >= 0 {
				return errors.New("write: broken pipe")
			}
			return mem.Release(ctx, key, owner)
		},
	}
	m, err := idem.New(store, idem.WithLease(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(201)
	}))
	if w := serve(h, "k", ""); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("first: %d, want 503", w.Code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Shutdown(ctx); err != nil { // waits for the releases
		t.Fatal(err)
	}
	if w := serve(h, "k", ""); w.Code != 201 || runs.Load() != 1 {
		t.Fatalf("retry: %d %s, handler ran %d times after %d releases; want 201 at once", w.Code, w.Body, runs.Load(), releases.Load())
	}
	if n := releases.Load(); n != 4 {
		t.Fatalf("%d releases, want 4 (3 failed, then the one that freed the key)", n)
	}
}

// The release after a failed Acquire stops at a definitive answer
// (nothing of this owner's is held) and, while the store keeps failing,
// once the lease it may have taken would have run out: Shutdown does not
// wait longer than that.
func TestFailedAcquireUnlockStops(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		lease   time.Duration
		atLeast int64 // releases
		atMost  int64
	}{
		{"not owner", fmt.Errorf("gone: %w", storage.ErrNotOwner), 30 * time.Second, 1, 1},
		{"failing", errors.New("write: broken pipe"), 200 * time.Millisecond, 2, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem, _ := newMemStore(t)
			var releases atomic.Int64
			store := &hookStore{Store: mem,
				acquire: func(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
					return storage.Result{}, errors.New("read: connection reset by peer")
				},
				release: func(ctx context.Context, key, owner string) error {
					releases.Add(1)
					return tc.err
				},
			}
			m, err := idem.New(store, idem.WithLease(tc.lease))
			if err != nil {
				t.Fatal(err)
			}
			h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
			if w := serve(h, "k", ""); w.Code != http.StatusServiceUnavailable {
				t.Fatalf("status %d, want 503", w.Code)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := m.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			if n := releases.Load(); n < tc.atLeast || n > tc.atMost {
				t.Fatalf("%d releases, want %d..%d", n, tc.atLeast, tc.atMost)
			}
		})
	}
}

// A store that answers storage.ErrCorrupt (the value under the key is not
// an entry) gets 500 ErrCorruptRecord without Retry-After, also
// WithFailOpen, and the handler does not run; no release is sent (nothing
// was taken). On the main before this fix: 503 with Retry-After, and
// WithFailOpen ran the handler.
func TestStoreCorruptValue(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		mem, _ := newMemStore(t)
		var releases atomic.Int64
		store := &hookStore{Store: mem,
			acquire: func(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
				return storage.Result{}, fmt.Errorf("somestore: acquire: %w", storage.ErrCorrupt)
			},
			release: func(ctx context.Context, key, owner string) error { releases.Add(1); return nil },
		}
		var log eventLog
		opts := []idem.Option{idem.WithObserver(log.observe)}
		if failOpen {
			opts = append(opts, idem.WithFailOpen())
		}
		m, err := idem.New(store, opts...)
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int64
		h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1) }))
		w := serve(h, "k", "")
		if w.Code != 500 || w.Header().Get("Retry-After") != "" || !strings.Contains(w.Body.String(), "#ErrCorruptRecord") || runs.Load() != 0 {
			t.Errorf("fail open %v: %d, Retry-After %q, %s, handler ran %d times; want 500 ErrCorruptRecord, none, not run",
				failOpen, w.Code, w.Header().Get("Retry-After"), w.Body, runs.Load())
		}
		if err := m.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := log.outcomes(); len(got) != 1 || got[0] != idem.StoreError || !errors.Is(log.ev[0].Err, storage.ErrCorrupt) {
			t.Errorf("fail open %v: events %v %v, want one store-error wrapping storage.ErrCorrupt", failOpen, got, log.ev)
		}
		if n := releases.Load(); n != 0 {
			t.Errorf("fail open %v: %d releases, want none", failOpen, n)
		}
		_, err = m.Do(context.Background(), "op", "k", func(ctx context.Context) ([]byte, error) { runs.Add(1); return nil, nil })
		if !errors.Is(err, idem.ErrCorruptRecord) || runs.Load() != 0 {
			t.Errorf("fail open %v: Do: %v, ran %d times; want ErrCorruptRecord, not run", failOpen, err, runs.Load())
		}
	}
}

// A handler that outlived its lease while a retry ran it again is reported
// lease-lost, even when both wrote the very same response: the store
// checks the owner on every Complete. On the main before this fix the
// memory store took the loser's identical record as a resend, and both
// executions were reported executed: the double run was hidden.
func TestDoubleRunNotHidden(t *testing.T) {
	mem, clk := newMemStore(t)
	var log eventLog
	m, err := idem.New(mem, idem.WithLease(30*time.Second), idem.WithObserver(log.observe))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	entered, proceed := make(chan struct{}), make(chan struct{})
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(entered)
			<-proceed
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "order placed")
	}))
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- serve(h, "k", "") }()
	<-entered
	clk.Advance(31 * time.Second) // the first's lease runs out (its process stalled)
	if w := serve(h, "k", ""); w.Code != http.StatusCreated || runs.Load() != 2 {
		t.Fatalf("retry after the lease: %d, handler ran %d times", w.Code, runs.Load())
	}
	close(proceed)
	<-first
	got := log.outcomes()
	if len(got) != 2 || got[0] != idem.Executed || got[1] != idem.LeaseLost {
		t.Fatalf("events %v, want executed (the retry) and lease-lost (the first)", got)
	}
}

// TestRequestCarriesLease: a protected request's context, and any context
// derived from it, carries the execution's storage.Lease for a store's
// fence; a request the middleware does not protect carries none.
func TestRequestCarriesLease(t *testing.T) {
	store, _ := newMemStore(t)
	m, err := idem.New(store, idem.WithTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var (
		lease, derived storage.Lease
		ok, okDerived  bool
		info           idem.Info
	)
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lease, ok = storage.LeaseFromContext(r.Context())
		ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
		defer cancel()
		derived, okDerived = storage.LeaseFromContext(ctx)
		info, _ = idem.FromContext(r.Context())
		w.WriteHeader(http.StatusCreated)
	}))
	if w := serve(h, "k-1", "{}"); w.Code != http.StatusCreated {
		t.Fatalf("status %d", w.Code)
	}
	want := storage.Lease{Key: info.StorageKey, Owner: info.Owner, TTL: time.Hour}
	if !ok || lease != want || info.StorageKey == "" || len(info.Owner) != 32 {
		t.Fatalf("protected request: lease %+v, %v; want %+v", lease, ok, want)
	}
	if !okDerived || derived != want {
		t.Fatalf("derived context: lease %+v, %v; want %+v", derived, okDerived, want)
	}
	if w := serve(h, "", "{}"); w.Code != http.StatusCreated {
		t.Fatalf("status %d", w.Code)
	}
	if ok {
		t.Fatalf("request without a key: lease %+v, want none", lease)
	}
}
