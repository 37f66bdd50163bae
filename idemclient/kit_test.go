package idemclient

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testclock"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
)

// kit is a test server running a handler behind the kit's own middleware
// on a memory store, on a listener whose connections a handler can cut.
type kit struct {
	*httptest.Server
	store    *faultyStore
	conns    atomic.Int64 // connections accepted
	requests atomic.Int64 // requests that reached the middleware
	executed chan struct{}

	mu     sync.Mutex
	events []idem.Event
}

// newKit starts a kit serving h on POST /orders (and any other method on
// /any) with the middleware's options opts.
func newKit(t *testing.T, h http.HandlerFunc, opts ...idem.Option) *kit {
	t.Helper()
	k := &kit{store: &faultyStore{Store: memstore.New()}, executed: make(chan struct{}, 16)}
	t.Cleanup(func() { k.store.Store.(*memstore.Store).Close() })
	opts = append(opts, idem.WithObserver(func(e idem.Event) {
		k.mu.Lock()
		k.events = append(k.events, e)
		k.mu.Unlock()
		if e.Outcome == idem.Executed || e.Outcome == idem.NotReplayable {
			select {
			case k.executed <- struct{}{}:
			default: // nobody waits for so many (TestConcurrentRequests)
			}
		}
	}))
	m, err := idem.New(k.store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k.requests.Add(1)
		nethttp.Middleware(m)(h).ServeHTTP(w, r)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", counted)
	mux.Handle("/any", counted)
	k.Server = httptest.NewUnstartedServer(mux)
	k.Listener = &cutListener{Listener: k.Listener, accepted: &k.conns}
	k.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, c)
	}
	k.Start()
	t.Cleanup(k.Close)
	return k
}

// waitExecuted waits until the middleware has stored a response.
func (k *kit) waitExecuted(t *testing.T) {
	t.Helper()
	select {
	case <-k.executed:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request was not stored within 10 s")
	}
}

// faultyStore fails Acquire while fail is positive, one call per unit, as
// an unreachable store does: the middleware answers 503 with Retry-After.
type faultyStore struct {
	storage.Store
	fail atomic.Int64
}

var errStoreDown = errors.New("test: store down")

func (s *faultyStore) Acquire(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
	if s.fail.Add(-1) >= 0 {
		return storage.Result{}, errStoreDown
	}
	s.fail.Store(0)
	return s.Store.Acquire(ctx, key, owner, fp, lease)
}

type connKey struct{}

// cutListener hands out cutConns and counts them.
type cutListener struct {
	net.Listener
	accepted *atomic.Int64
}

func (l *cutListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.accepted.Add(1)
	return &cutConn{Conn: c}, nil
}

// cutConn is a server connection that a handler can arm to break on the
// response's first write: the response never reaches the client, after
// the middleware has stored it.
type cutConn struct {
	net.Conn
	armed atomic.Bool
}

func (c *cutConn) Write(p []byte) (int, error) {
	if c.armed.Load() {
		c.Conn.Close()
		return 0, net.ErrClosed
	}
	return c.Conn.Write(p)
}

// connOf returns the connection that carries r.
func connOf(r *http.Request) *cutConn { return r.Context().Value(connKey{}).(*cutConn) }

// cutResponse makes the response to r vanish: the connection closes when
// the server writes it.
func cutResponse(r *http.Request) { connOf(r).armed.Store(true) }

// newBase returns an http.Transport of the test's own, its idle
// connections closed at the end.
func newBase(t *testing.T) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// fakeTime replaces a Transport's clock and waits: a wait is recorded and
// moves the clock, and returns at once.
type fakeTime struct {
	clock *testclock.Clock
	start time.Time

	mu     sync.Mutex
	waits  []time.Duration
	onWait func(n int) // called after wait n (1-based) with the clock moved
}

func useFakeTime(tr *Transport) *fakeTime {
	ft := &fakeTime{start: time.Now()}
	ft.clock = testclock.New(ft.start)
	tr.now = ft.clock.Now
	tr.sleep = func(ctx context.Context, cancel <-chan struct{}, d time.Duration) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		ft.mu.Lock()
		ft.waits = append(ft.waits, d)
		n, f := len(ft.waits), ft.onWait
		ft.mu.Unlock()
		ft.clock.Advance(d)
		if f != nil {
			f(n)
		}
		return ctx.Err()
	}
	return ft
}

func (ft *fakeTime) recorded() []time.Duration {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	return append([]time.Duration(nil), ft.waits...)
}

// hookLog collects the attempts a transport reports.
type hookLog struct {
	mu       sync.Mutex
	attempts []Attempt
}

func (h *hookLog) add(a Attempt) {
	h.mu.Lock()
	h.attempts = append(h.attempts, a)
	h.mu.Unlock()
}

func (h *hookLog) all() []Attempt {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Attempt(nil), h.attempts...)
}

// background sends a POST of {} with key to url from another goroutine,
// on a client of its own, and delivers the answer.
func background(url, key string) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		base := &http.Transport{}
		defer base.CloseIdleConnections()
		req, _ := http.NewRequest("POST", url, strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := (&http.Client{Transport: base}).Do(req)
		if err != nil {
			ch <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		ch <- answer{status: resp.StatusCode, body: string(b), err: err}
	}()
	return ch
}

// record is a list of strings that handlers append to and the test reads,
// safe for concurrent use (a response over TCP is no synchronization the
// race detector knows of).
type record struct {
	mu sync.Mutex
	v  []string
}

func (r *record) add(s string) {
	r.mu.Lock()
	r.v = append(r.v, s)
	r.mu.Unlock()
}

// get returns a copy of the list.
func (r *record) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.v...)
}

// last returns the last string added, "" if none.
func (r *record) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.v) == 0 {
		return ""
	}
	return r.v[len(r.v)-1]
}

func (r *record) reset() {
	r.mu.Lock()
	r.v = nil
	r.mu.Unlock()
}
