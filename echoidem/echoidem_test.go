package echoidem_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/internal/conformance"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(redistest.Wrap(m)) // stops the redis-servers the conformance suite started
}

// echoPattern translates net/http's "/items/{id}" and "/files/{rest...}".
func echoPattern(p string) string {
	p = regexp.MustCompile(`\{\w+\.\.\.\}`).ReplaceAllString(p, "*")
	return regexp.MustCompile(`\{(\w+)\}`).ReplaceAllString(p, ":$1")
}

// newEcho returns an Echo that logs nothing.
func newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Logger.SetOutput(io.Discard)
	return e
}

func TestConformance(t *testing.T) {
	t.Run("global", func(t *testing.T) {
		conformance.Run(t, conformance.Adapter{Name: "echo", Mount: func(m *idem.Middleware, routes ...conformance.Route) http.Handler {
			e := newEcho()
			e.Use(middleware.Recover(), echoidem.Middleware(m))
			for _, rt := range routes {
				e.Add(rt.Method, echoPattern(rt.Pattern), echo.WrapHandler(rt.Handler))
			}
			return e
		}})
	})
	t.Run("per-route", func(t *testing.T) {
		conformance.Run(t, conformance.Adapter{Name: "echo-route", Mount: func(m *idem.Middleware, routes ...conformance.Route) http.Handler {
			e := newEcho()
			e.Use(middleware.Recover())
			for _, rt := range routes {
				e.Add(rt.Method, echoPattern(rt.Pattern), echo.WrapHandler(rt.Handler), echoidem.Middleware(m))
			}
			return e
		}})
	})
}

// storeKinds are the stores every trap test runs on.
var storeKinds = []struct {
	name string
	open func(t *testing.T) storage.Store
}{
	{"memory", func(t *testing.T) storage.Store {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s
	}},
	{"miniredis", func(t *testing.T) storage.Store {
		rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
		t.Cleanup(func() { rdb.Close() })
		return redisstore.New(rdb)
	}},
}

// env is a real server: newEcho, middleware.Recover, then whatever setup
// adds.
type env struct {
	t      *testing.T
	srv    *httptest.Server
	events *events
}

type events struct {
	mu  sync.Mutex
	all []idem.Outcome
}

func (e *events) add(ev idem.Event) {
	e.mu.Lock()
	e.all = append(e.all, ev.Outcome)
	e.mu.Unlock()
}

func (e *events) get() []idem.Outcome {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]idem.Outcome(nil), e.all...)
}

type opener func(setup func(*echo.Echo, *idem.Middleware)) *env

// eachStore runs f on every store kind, in parallel subtests.
func eachStore(t *testing.T, f func(t *testing.T, open opener)) {
	for _, sk := range storeKinds {
		t.Run(sk.name, func(t *testing.T) {
			t.Parallel()
			f(t, func(setup func(*echo.Echo, *idem.Middleware)) *env {
				v := &env{t: t, events: &events{}}
				m, err := idem.New(sk.open(t), idem.WithObserver(v.events.add))
				if err != nil {
					t.Fatal(err)
				}
				e := newEcho()
				e.Use(middleware.Recover())
				setup(e, m)
				v.srv = httptest.NewServer(e)
				t.Cleanup(v.srv.Close)
				return v
			})
		})
	}
}

type reply struct {
	status int
	header http.Header
	body   string
}

func (e *env) post(path, key, body string) reply {
	e.t.Helper()
	res := e.send(path, key, body)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return reply{res.StatusCode, res.Header, string(b)}
}

func (e *env) send(path, key, body string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return res
}

// same requires r to be a replay of orig: status, body, Content-Type.
func same(t *testing.T, orig, r reply) {
	t.Helper()
	if r.status != orig.status || r.body != orig.body || r.header.Get("Content-Type") != orig.header.Get("Content-Type") {
		t.Fatalf("replay %d %q %q, original %d %q %q", r.status, r.header.Get("Content-Type"), r.body,
			orig.status, orig.header.Get("Content-Type"), orig.body)
	}
	if r.header.Get("Idempotent-Replayed") != "true" || orig.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("Idempotent-Replayed: original %q, replay %q", orig.header.Get("Idempotent-Replayed"), r.header.Get("Idempotent-Replayed"))
	}
}

func want(t *testing.T, runs *atomic.Int64, n int64) {
	t.Helper()
	if got := runs.Load(); got != n {
		t.Fatalf("handler ran %d times, want %d", got, n)
	}
}

// A returned echo.HTTPError writes nothing until Echo's error handler runs
// after the chain: the middleware must render it with c.Error to record it.
func TestHTTPErrorReplayed(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		var runs atomic.Int64
		v := open(func(e *echo.Echo, m *idem.Middleware) {
			e.POST("/pay", func(c echo.Context) error {
				runs.Add(1)
				c.Response().Header().Set("X-Attempt", "1")
				return echo.NewHTTPError(http.StatusPaymentRequired, "declined")
			}, echoidem.Middleware(m))
		})
		orig := v.post("/pay", "k", "")
		if orig.status != 402 || orig.body != "{\"message\":\"declined\"}\n" || orig.header.Get("Content-Type") != "application/json" ||
			orig.header.Get("X-Attempt") != "1" {
			t.Fatalf("original: %v", orig)
		}
		for range 2 {
			r := v.post("/pay", "k", "")
			same(t, orig, r)
			if r.header.Get("X-Attempt") != "1" {
				t.Fatalf("replay lost a header: %v", r.header)
			}
		}
		want(t, &runs, 1)
		if got := v.events.get(); len(got) != 3 || got[0] != idem.Executed || got[2] != idem.Replayed {
			t.Fatalf("events %v", got)
		}
	})
}

// A plain error becomes a 500, which releases the key: the retry runs the
// handler again.
func TestPlainErrorReleases(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		var runs atomic.Int64
		v := open(func(e *echo.Echo, m *idem.Middleware) {
			e.Use(echoidem.Middleware(m))
			e.POST("/o", func(c echo.Context) error {
				if runs.Add(1) == 1 {
					return errors.New("database unavailable")
				}
				return c.String(http.StatusCreated, "created")
			})
		})
		if r := v.post("/o", "k", ""); r.status != 500 || r.body != "{\"message\":\"Internal Server Error\"}\n" {
			t.Fatalf("first: %v", r)
		}
		second := v.post("/o", "k", "")
		if second.status != 201 || second.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("retry after 500 did not run the handler: %v", second)
		}
		same(t, second, v.post("/o", "k", ""))
		want(t, &runs, 2)
		if got := v.events.get(); len(got) != 3 || got[0] != idem.Released || got[1] != idem.Executed {
			t.Fatalf("events %v", got)
		}
	})
}

// The error is rendered once: the middleware returns nil after c.Error, so
// an error handler that ignores Committed does not write a second body, and
// a replay or refusal is not followed by the handler.
func TestNoDoubleWrite(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		var runs, handled atomic.Int64
		v := open(func(e *echo.Echo, m *idem.Middleware) {
			e.HTTPErrorHandler = func(err error, c echo.Context) {
				handled.Add(1)
				c.String(http.StatusConflict, "custom: "+err.Error()) // ignores Committed
			}
			e.Use(echoidem.Middleware(m))
			e.POST("/o", func(c echo.Context) error {
				runs.Add(1)
				return errors.New("out of stock")
			})
		})
		orig := v.post("/o", "k", "")
		if orig.status != 409 || orig.body != "custom: out of stock" {
			t.Fatalf("original: %v", orig)
		}
		same(t, orig, v.post("/o", "k", ""))
		if r := v.post("/o", "k", "other"); r.status != 422 || strings.Contains(r.body, "custom") {
			t.Fatalf("mismatch: %v", r)
		}
		want(t, &runs, 1)
		if handled.Load() != 1 {
			t.Fatalf("the error handler ran %d times, want 1", handled.Load())
		}
	})
}

// c.Response().Flush() reaches the client at once and does not panic, and
// the streamed response is replayed.
func TestResponseFlush(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		proceed := make(chan struct{})
		var runs atomic.Int64
		v := open(func(e *echo.Echo, m *idem.Middleware) {
			e.POST("/o", func(c echo.Context) error {
				runs.Add(1)
				res := c.Response()
				res.Header().Set("Content-Type", "text/plain")
				res.WriteHeader(http.StatusAccepted)
				io.WriteString(res, "first;")
				res.Flush()
				select {
				case <-proceed:
				case <-time.After(10 * time.Second):
					t.Error("the client never saw the flushed chunk")
				}
				io.WriteString(res, "second")
				return nil
			}, echoidem.Middleware(m))
		})
		res := v.send("/o", "k", "")
		defer res.Body.Close()
		head := make([]byte, len("first;"))
		if _, err := io.ReadFull(res.Body, head); err != nil || string(head) != "first;" {
			t.Fatalf("first chunk %q: %v", head, err)
		}
		close(proceed)
		rest, _ := io.ReadAll(res.Body)
		orig := reply{res.StatusCode, res.Header, string(head) + string(rest)}
		if orig.status != 202 || orig.body != "first;second" {
			t.Fatalf("original: %v", orig)
		}
		same(t, orig, v.post("/o", "k", ""))
		want(t, &runs, 1)
	})
}

// Requests that matched no route pass through and are never stored: Echo's
// 404 (c.Path() == ""), its 405 (c.Path() is the pattern of the other
// methods' route), a RouteNotFound route, and the catch-all 404 route that
// Group.Use registers so that group middleware runs.
func TestUnmatchedRouteNotStored(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		var runs atomic.Int64
		global := open(func(e *echo.Echo, m *idem.Middleware) {
			e.Use(echoidem.Middleware(m))
			e.GET("/only-get", func(c echo.Context) error { return nil })
			e.RouteNotFound("/missing/*", func(c echo.Context) error { return c.String(http.StatusNotFound, "custom 404") })
		})
		group := open(func(e *echo.Echo, m *idem.Middleware) {
			g := e.Group("/api", echoidem.Middleware(m))
			g.POST("/o", func(c echo.Context) error { runs.Add(1); return c.String(http.StatusCreated, "made") })
		})
		cases := []struct {
			v      *env
			path   string
			status int
		}{{global, "/nope", 404}, {global, "/only-get", 405}, {global, "/missing/x", 404}, {group, "/api/typo", 404}, {group, "/api", 404}}
		for range 2 {
			for _, tc := range cases {
				if r := tc.v.post(tc.path, "k", ""); r.status != tc.status || r.header.Get("Idempotent-Replayed") != "" {
					t.Fatalf("%s: %v", tc.path, r)
				}
			}
		}
		if got := append(global.events.get(), group.events.get()...); len(got) != 0 {
			t.Fatalf("unmatched routes reached the middleware's protocol: %v", got)
		}
		// The group's own route is protected.
		group.post("/api/o", "k", "")
		if r := group.post("/api/o", "k", ""); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("group route: %v", r)
		}
		want(t, &runs, 1)
	})
}

// A request the Skipper skips bypasses the middleware.
func TestSkipper(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		var runs atomic.Int64
		v := open(func(e *echo.Echo, m *idem.Middleware) {
			e.Use(echoidem.MiddlewareWithConfig(echoidem.Config{
				Middleware: m,
				Skipper:    func(c echo.Context) bool { return c.Path() == "/internal" },
			}))
			h := func(c echo.Context) error { return c.String(http.StatusCreated, c.Path()) }
			e.POST("/internal", func(c echo.Context) error { runs.Add(1); return h(c) })
			e.POST("/public", h)
		})
		for range 2 {
			if r := v.post("/internal", "k", ""); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("skipped route: %v", r)
			}
		}
		want(t, &runs, 2)
		v.post("/public", "k", "")
		if r := v.post("/public", "k", ""); r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("route not skipped: %v", r)
		}
		if got := v.events.get(); len(got) != 2 {
			t.Fatalf("events %v", got)
		}
	})
}

// Outer middleware (a logger) sees the final status and size in its
// Response, replays and refusals included, and gets its Response back,
// also after a panic; a panic still becomes Recover's 500 and releases the
// key.
func TestOuterMiddlewareSeesFinalStatus(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		var mu sync.Mutex
		var logged []int
		var runs atomic.Int64
		v := open(func(e *echo.Echo, m *idem.Middleware) {
			e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
				return func(c echo.Context) error {
					res := c.Response()
					defer func() {
						if c.Response() != res {
							t.Error("c.Response() was not restored")
						}
						mu.Lock()
						logged = append(logged, res.Status)
						mu.Unlock()
					}()
					if err := next(c); err != nil {
						t.Errorf("the middleware returned %v", err)
					}
					return nil
				}
			}, middleware.Recover(), echoidem.Middleware(m))
			e.POST("/o", func(c echo.Context) error {
				if runs.Add(1) == 1 {
					panic("boom")
				}
				return echo.NewHTTPError(http.StatusPaymentRequired, "declined")
			})
		})
		for _, want := range []int{500, 402, 402, 422} {
			body := ""
			if want == 422 {
				body = "other"
			}
			if r := v.post("/o", "k", body); r.status != want {
				t.Fatalf("got %v, want status %d", r, want)
			}
		}
		want(t, &runs, 2)
		mu.Lock()
		defer mu.Unlock()
		if want := []int{500, 402, 402, 422}; len(logged) != 4 || logged[0] != want[0] || logged[1] != want[1] || logged[2] != want[2] || logged[3] != want[3] {
			t.Fatalf("logged %v, want %v", logged, want)
		}
	})
}

// The Response the handler sees keeps Echo's semantics on a recorder:
// WriteHeader commits at once (first wins), Flush does not panic.
func TestResponseOnRecorder(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	e := newEcho()
	e.POST("/o", func(c echo.Context) error {
		res := c.Response()
		if res.Committed || res.Status != 200 {
			t.Errorf("initial: committed=%v status=%d", res.Committed, res.Status)
		}
		res.WriteHeader(201)
		res.WriteHeader(500) // ignored: committed
		if !res.Committed || res.Status != 201 {
			t.Errorf("after WriteHeader: committed=%v status=%d", res.Committed, res.Status)
		}
		res.Write([]byte("ab"))
		res.Flush()
		if err := http.NewResponseController(res).Flush(); err != nil {
			t.Errorf("ResponseController.Flush: %v", err)
		}
		if res.Size != 2 {
			t.Errorf("Size %d", res.Size)
		}
		return nil
	}, echoidem.Middleware(m))
	for i := range 2 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/o", nil)
		req.Header.Set("Idempotency-Key", "k")
		e.ServeHTTP(rec, req)
		if rec.Code != 201 || rec.Body.String() != "ab" || (i == 0 && !rec.Flushed) || (i == 1) != (rec.Header().Get("Idempotent-Replayed") == "true") {
			t.Errorf("request %d: %d %q flushed=%v %v", i, rec.Code, rec.Body, rec.Flushed, rec.Header())
		}
	}
}

func TestConfig(t *testing.T) {
	func() {
		defer func() {
			if recover() == nil {
				t.Error("MiddlewareWithConfig without Middleware did not panic")
			}
		}()
		echoidem.MiddlewareWithConfig(echoidem.Config{})
	}()
	if echoidem.DefaultConfig.Skipper == nil || echoidem.DefaultConfig.Skipper(nil) {
		t.Error("DefaultConfig.Skipper skips")
	}
}
