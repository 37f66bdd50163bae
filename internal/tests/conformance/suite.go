package conformance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// Run runs every scenario for adapter a on every store: the memory store;
// redisstore on miniredis, on a real redis-server and on a real
// three-master Redis Cluster; rueidisstore on the same server and
// Cluster; pgstore on a private PostgreSQL; sqlstore on a private MariaDB;
// dynamostore on a private dynalite (the real servers skipped when they
// are not available, unless IDEM_REQUIRE_REDIS=1, IDEM_REQUIRE_PG=1,
// IDEM_REQUIRE_MYSQL=1 and IDEM_REQUIRE_DYNAMODB=1).
func Run(t *testing.T, a Adapter) {
	for _, sk := range storeKinds {
		t.Run(sk.name, func(t *testing.T) {
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					t.Parallel()
					sc.run(t, &suite{t: t, a: a, sk: sk})
				})
			}
		})
	}
}

type suite struct {
	t  *testing.T
	a  Adapter
	sk storeKind
}

// env is one server under test.
type env struct {
	t       *testing.T
	srv     *httptest.Server
	spy     *spy
	ev      *events
	advance func(time.Duration) // moves the store's clock forward
	m       *idem.Middleware
}

func (s *suite) env(routes []Route, opts ...idem.Option) *env {
	return s.wrappedEnv(nil, routes, opts...)
}

// wrappedEnv is env with the framework's handler wrapped by wrap, when not
// nil: a plain net/http handler in front of the framework, to watch the
// request as the server hands it over.
func (s *suite) wrappedEnv(wrap func(http.Handler) http.Handler, routes []Route, opts ...idem.Option) *env {
	return s.serverEnv(wrap, nil, routes, opts...)
}

// serverEnv is wrappedEnv with the http.Server configured by conf, when
// not nil, before it starts (for example its WriteTimeout).
func (s *suite) serverEnv(wrap func(http.Handler) http.Handler, conf func(*http.Server), routes []Route, opts ...idem.Option) *env {
	t := s.t
	store, advance := s.sk.open(t)
	e := &env{t: t, spy: &spy{Store: store, acquired: make(chan struct{}, 64)}, ev: &events{}, advance: advance}
	m, err := idem.New(e.spy, append([]idem.Option{idem.WithObserver(e.ev.observe)}, opts...)...)
	if err != nil {
		t.Fatalf("idem.New: %v", err)
	}
	e.m = m
	// Last, once the server is closed: the store back up, the middleware
	// shut down, so that no background work of it (a release after a
	// failed Acquire, a completion retried) outlives the test.
	t.Cleanup(func() {
		e.spy.down.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	h := authenticate(s.a.Mount(m, routes...))
	if wrap != nil {
		h = wrap(h)
	}
	e.srv = httptest.NewUnstartedServer(h)
	if conf != nil {
		conf(e.srv.Config)
	}
	e.srv.Start()
	t.Cleanup(e.srv.Close)
	return e
}

// reply is what a client received.
type reply struct {
	status  int
	header  http.Header
	body    []byte
	trailer http.Header
}

func (r reply) String() string { return fmt.Sprintf("%d %v %q", r.status, r.header, r.body) }

type req struct {
	method, path, key, body string
	header                  http.Header
	chunked                 bool
}

func (e *env) do(q req) reply {
	e.t.Helper()
	r, err := e.send(context.Background(), q)
	if err != nil {
		e.t.Fatalf("%s %s: %v", q.method, q.path, err)
	}
	return r
}

// send sends q with ctx. When the body cannot be read to its end, it
// returns what was read with the error.
func (e *env) send(ctx context.Context, q req) (reply, error) {
	var body io.Reader = strings.NewReader(q.body)
	if q.chunked {
		body = io.MultiReader(strings.NewReader(q.body)) // unknown length: sent chunked
	}
	if q.method == "" {
		q.method = http.MethodPost
	}
	r, err := http.NewRequestWithContext(ctx, q.method, e.srv.URL+q.path, body)
	if err != nil {
		return reply{}, err
	}
	for k, vs := range q.header {
		r.Header[k] = vs
	}
	if q.key != "" {
		r.Header.Set("Idempotency-Key", q.key)
	}
	res, err := e.srv.Client().Do(r)
	if err != nil {
		return reply{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		err = fmt.Errorf("reading body: %w", err)
	}
	return reply{status: res.StatusCode, header: res.Header, body: b, trailer: res.Trailer}, err
}

// raw sends a request written by hand, for header values that Go's
// client refuses to send (control characters, non-ASCII bytes).
func (e *env) raw(method, path string, headerLines ...string) reply {
	e.t.Helper()
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	msg := method + " " + path + " HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\nConnection: close\r\n"
	for _, l := range headerLines {
		msg += l + "\r\n"
	}
	if _, err := io.WriteString(conn, msg+"\r\n"); err != nil {
		e.t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		e.t.Fatalf("raw %s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return reply{status: res.StatusCode, header: res.Header, body: b, trailer: res.Trailer}
}

// post sends a POST with a key and a body.
func (e *env) post(path, key, body string) reply {
	e.t.Helper()
	return e.do(req{path: path, key: key, body: body})
}

// counter is a handler wrapper that counts executions.
type counter struct{ n atomic.Int64 }

func (c *counter) wrap(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.n.Add(1)
		h(w, r)
	})
}

func (c *counter) want(t *testing.T, n int64) {
	t.Helper()
	if got := c.n.Load(); got != n {
		t.Fatalf("handler ran %d times, want %d", got, n)
	}
}

// sameResponse requires replay to equal orig, plus Idempotent-Replayed.
func sameResponse(t *testing.T, orig, replay reply) {
	t.Helper()
	if replay.status != orig.status {
		t.Fatalf("replay status %d, original %d", replay.status, orig.status)
	}
	if !bytes.Equal(replay.body, orig.body) {
		t.Fatalf("replay body %q, original %q", replay.body, orig.body)
	}
	if got := replay.header.Get("Idempotent-Replayed"); got != "true" {
		t.Fatalf("replay Idempotent-Replayed = %q, want true", got)
	}
	if orig.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("original response carries Idempotent-Replayed")
	}
	skip := map[string]bool{"Date": true, "Content-Length": true, "Idempotent-Replayed": true, "Set-Cookie": true, "Transfer-Encoding": true}
	for k, v := range orig.header {
		if !skip[k] && !equalStrings(replay.header[k], v) {
			t.Fatalf("replay header %s = %q, original %q", k, replay.header[k], v)
		}
	}
	for k, v := range replay.header {
		if !skip[k] && orig.header[k] == nil {
			t.Fatalf("replay has header %s = %q that the original lacks", k, v)
		}
	}
	for k, v := range orig.trailer {
		if !equalStrings(replay.trailer[k], v) {
			t.Fatalf("replay trailer %s = %q, original %q", k, replay.trailer[k], v)
		}
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// problem decodes an RFC 9457 body and checks it names kind.
func problem(t *testing.T, r reply, status int, kind error) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d (%s)", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p struct {
		Type, Title, Detail string
		Status              int
	}
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	var name string
	for n, k := range kindNames {
		if errors.Is(k, kind) {
			name = n
		}
	}
	if want := "https://pkg.go.dev/github.com/idemkit/idem#" + name; p.Type != want {
		t.Fatalf("problem type %q, want %q", p.Type, want)
	}
	if p.Status != status || p.Title == "" || p.Detail == "" {
		t.Fatalf("problem %+v incomplete", p)
	}
}

var kindNames = map[string]error{
	"ErrMissingKey": idem.ErrMissingKey, "ErrInvalidKey": idem.ErrInvalidKey, "ErrBodyTooLarge": idem.ErrBodyTooLarge,
	"ErrConflict": idem.ErrConflict, "ErrMismatch": idem.ErrMismatch, "ErrNotReplayable": idem.ErrNotReplayable,
	"ErrStoreUnavailable": idem.ErrStoreUnavailable, "ErrCorruptRecord": idem.ErrCorruptRecord,
	"ErrKeyNotIssued": idem.ErrKeyNotIssued, "ErrCanceled": idem.ErrCanceled, "ErrBodyRead": idem.ErrBodyRead,
	"ErrScopeUnknown": idem.ErrScopeUnknown,
}

func retryAfter(t *testing.T, r reply) int {
	t.Helper()
	n, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || n < 1 {
		t.Fatalf("Retry-After %q, want whole seconds >= 1", r.header.Get("Retry-After"))
	}
	return n
}

var ownerRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// gate blocks handlers until opened.
type gate struct {
	entered chan struct{}
	open    chan struct{}
	once    sync.Once
}

func newGate() *gate { return &gate{entered: make(chan struct{}, 100), open: make(chan struct{})} }

func (g *gate) wait() {
	g.entered <- struct{}{}
	<-g.open
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

// authenticate is every env's authentication, in front of the framework,
// as an application's: it names the principal of a request whose
// credentials it verified (see withPrincipal). Other requests go on
// without one.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, withPrincipal(r))
	})
}

// withPrincipal returns r with the principal of its bearer token named in
// its context: "Bearer alice" and "Bearer alice.2" (a refreshed token)
// are alice's. Other credentials (a raw "Token x", say) name none.
func withPrincipal(r *http.Request) *http.Request {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		return r
	}
	sub, _, _ := strings.Cut(token, ".")
	return r.WithContext(idem.ContextWithPrincipal(r.Context(), sub))
}
