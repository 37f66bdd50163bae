package echoidem_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/internal/dynamotest"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/internal/tests/conformance"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

func TestMain(m *testing.M) {
	// Stops the servers the conformance suite started.
	leakcheck.Main(dynamotest.Wrap(mysqltest.Wrap(pgtest.Wrap(redistest.Wrap(m)))))
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
				e.Add(rt.Method, conformance.ColonPattern(rt.Pattern, "*"), echo.WrapHandler(rt.Handler))
			}
			return e
		}})
	})
	t.Run("per-route", func(t *testing.T) {
		conformance.Run(t, conformance.Adapter{Name: "echo-route", Mount: func(m *idem.Middleware, routes ...conformance.Route) http.Handler {
			e := newEcho()
			e.Use(middleware.Recover())
			for _, rt := range routes {
				e.Add(rt.Method, conformance.ColonPattern(rt.Pattern, "*"), echo.WrapHandler(rt.Handler), echoidem.Middleware(m))
			}
			return e
		}})
	})
}

// opener starts a real server: newEcho, middleware.Recover, then whatever
// setup adds, with a Middleware on a fresh store.
type opener = conformance.Open[*echo.Echo]

// eachStore runs f on every trap-test store kind, in parallel subtests.
func eachStore(t *testing.T, f func(t *testing.T, open opener)) {
	conformance.EachStore(t, func() *echo.Echo {
		e := newEcho()
		e.Use(middleware.Recover())
		return e
	}, f)
}

// A returned echo.HTTPError writes nothing until Echo's error handler runs
// after the chain: the middleware must render it with c.Error to record it.
func TestHTTPErrorReplayed(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		var runs conformance.Runs
		v := open(func(e *echo.Echo, m *idem.Middleware) {
			e.POST("/pay", func(c echo.Context) error {
				runs.Add(1)
				c.Response().Header().Set("X-Attempt", "1")
				return echo.NewHTTPError(http.StatusPaymentRequired, "declined")
			}, echoidem.Middleware(m))
		})
		orig := v.Post("/pay", "k", "")
		if orig.Status != 402 || orig.Body != "{\"message\":\"declined\"}\n" || orig.Header.Get("Content-Type") != "application/json" ||
			orig.Header.Get("X-Attempt") != "1" {
			t.Fatalf("original: %v", orig)
		}
		for range 2 {
			r := v.Post("/pay", "k", "")
			conformance.SameReply(t, orig, r)
			if r.Header.Get("X-Attempt") != "1" {
				t.Fatalf("replay lost a header: %v", r.Header)
			}
		}
		runs.Want(t, 1)
		if got := v.Outcomes(); len(got) != 3 || got[0] != idem.Executed || got[2] != idem.Replayed {
			t.Fatalf("events %v", got)
		}
	})
}

// A plain error becomes a 500, which releases the key: the retry runs the
// handler again.
func TestPlainErrorReleases(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		var runs conformance.Runs
		v := open(func(e *echo.Echo, m *idem.Middleware) {
			e.Use(echoidem.Middleware(m))
			e.POST("/o", func(c echo.Context) error {
				if runs.Add(1) == 1 {
					return errors.New("database unavailable")
				}
				return c.String(http.StatusCreated, "created")
			})
		})
		if r := v.Post("/o", "k", ""); r.Status != 500 || r.Body != "{\"message\":\"Internal Server Error\"}\n" {
			t.Fatalf("first: %v", r)
		}
		second := v.Post("/o", "k", "")
		if second.Status != 201 || second.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("retry after 500 did not run the handler: %v", second)
		}
		conformance.SameReply(t, second, v.Post("/o", "k", ""))
		runs.Want(t, 2)
		if got := v.Outcomes(); len(got) != 3 || got[0] != idem.Released || got[1] != idem.Executed {
			t.Fatalf("events %v", got)
		}
	})
}

// The error is rendered once: the middleware returns nil after c.Error, so
// an error handler that ignores Committed does not write a second body, and
// a replay or refusal is not followed by the handler.
func TestNoDoubleWrite(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		var runs conformance.Runs
		var handled atomic.Int64
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
		orig := v.Post("/o", "k", "")
		if orig.Status != 409 || orig.Body != "custom: out of stock" {
			t.Fatalf("original: %v", orig)
		}
		conformance.SameReply(t, orig, v.Post("/o", "k", ""))
		if r := v.Post("/o", "k", "other"); r.Status != 422 || strings.Contains(r.Body, "custom") {
			t.Fatalf("mismatch: %v", r)
		}
		runs.Want(t, 1)
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
		var runs conformance.Runs
		v := open(func(e *echo.Echo, m *idem.Middleware) {
			e.POST("/o", func(c echo.Context) error {
				runs.Add(1)
				res := c.Response()
				res.Header().Set("Content-Type", "text/plain")
				res.WriteHeader(http.StatusAccepted)
				io.WriteString(res, "first;")
				res.Flush()
				conformance.WaitOrTimeout(t, proceed, "the client never saw the flushed chunk")
				io.WriteString(res, "second")
				return nil
			}, echoidem.Middleware(m))
		})
		orig := v.PostStreamed("/o", "k", "first;", proceed)
		v.WantReplayed(orig, 202, "first;second", "/o", "k", &runs)
	})
}

// Requests that matched no route pass through and are never stored: Echo's
// 404 (c.Path() == ""), its 405 (c.Path() is the pattern of the other
// methods' route), a RouteNotFound route, and the catch-all 404 route that
// Group.Use registers so that group middleware runs.
func TestUnmatchedRouteNotStored(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		var runs conformance.Runs
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
			v      *conformance.Server
			path   string
			status int
		}{{global, "/nope", 404}, {global, "/only-get", 405}, {global, "/missing/x", 404}, {group, "/api/typo", 404}, {group, "/api", 404}}
		for range 2 {
			for _, tc := range cases {
				if r := tc.v.Post(tc.path, "k", ""); r.Status != tc.status || r.Header.Get("Idempotent-Replayed") != "" {
					t.Fatalf("%s: %v", tc.path, r)
				}
			}
		}
		if got := append(global.Outcomes(), group.Outcomes()...); len(got) != 0 {
			t.Fatalf("unmatched routes reached the middleware's protocol: %v", got)
		}
		// The group's own route is protected.
		group.Post("/api/o", "k", "")
		if r := group.Post("/api/o", "k", ""); r.Status != 201 || r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("group route: %v", r)
		}
		runs.Want(t, 1)
	})
}

// A request the Skipper skips bypasses the middleware.
func TestSkipper(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		var runs conformance.Runs
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
			if r := v.Post("/internal", "k", ""); r.Status != 201 || r.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("skipped route: %v", r)
			}
		}
		runs.Want(t, 2)
		v.Post("/public", "k", "")
		if r := v.Post("/public", "k", ""); r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("route not skipped: %v", r)
		}
		if got := v.Outcomes(); len(got) != 2 {
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
		var runs conformance.Runs
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
			if r := v.Post("/o", "k", body); r.Status != want {
				t.Fatalf("got %v, want status %d", r, want)
			}
		}
		runs.Want(t, 2)
		mu.Lock()
		defer mu.Unlock()
		if want := []int{500, 402, 402, 422}; !slices.Equal(logged, want) {
			t.Fatalf("logged %v, want %v", logged, want)
		}
	})
}

// The Response the handler sees keeps Echo's semantics on a recorder:
// WriteHeader commits at once (first wins), Flush does not panic.
func TestResponseOnRecorder(t *testing.T) {
	m := conformance.NewMiddleware(t)
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

// An Echo middleware before idem's sets a header for each request (a
// request id): a replay carries the retry's own, not the first request's,
// and the handler's headers as recorded.
func TestOuterHeaderNotReplayed(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		var n atomic.Int64
		e := open(func(e *echo.Echo, m *idem.Middleware) {
			e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
				return func(c echo.Context) error {
					c.Response().Header().Set("X-Request-Id", "req-"+strconv.FormatInt(n.Add(1), 10))
					return next(c)
				}
			}, echoidem.Middleware(m))
			e.POST("/o", func(c echo.Context) error {
				c.Response().Header().Set("X-Order", "42")
				return c.JSON(http.StatusCreated, map[string]int{"id": 42})
			})
		})
		first := e.Post("/o", "k", "")
		conformance.WantOwnHeaders(t, first, e.Post("/o", "k", ""))
	})
}

// failingHijacker is a server writer that can hijack in principle but
// refuses: its Hijack returns an error.
type failingHijacker struct{ *httptest.ResponseRecorder }

func (failingHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, errors.New("hijack refused")
}

// A Hijack that fails sends nothing: the handler may still answer, and the
// status it then sets is what the client gets, what c.Response() reports
// (to the handler and to the middleware before idem's), what is recorded
// and what the retry replays.
func TestStatusAfterFailedHijack(t *testing.T) {
	writers := []struct {
		name string
		wrap func(*httptest.ResponseRecorder) http.ResponseWriter
	}{
		{"writer cannot hijack", func(rec *httptest.ResponseRecorder) http.ResponseWriter { return rec }},
		{"hijack returns an error", func(rec *httptest.ResponseRecorder) http.ResponseWriter { return failingHijacker{rec} }},
	}
	answers := []struct {
		name, body, contentType string
		status                  int
		committed               bool // the status went out before the Hijack
		answer                  func(c echo.Context) error
	}{
		{"c.JSON(201)", "{\"id\":1}\n", "application/json", 201, false, func(c echo.Context) error { return c.JSON(http.StatusCreated, map[string]int{"id": 1}) }},
		{"c.NoContent(201)", "", "", 201, false, func(c echo.Context) error { return c.NoContent(http.StatusCreated) }},
		{"NewHTTPError(402)", "{\"message\":\"declined\"}\n", "application/json", 402, false, func(c echo.Context) error {
			return echo.NewHTTPError(http.StatusPaymentRequired, "declined")
		}},
		{"WriteHeader(202) before", "queued", "text/plain", 202, true, func(c echo.Context) error {
			_, err := c.Response().Write([]byte("queued"))
			return err
		}},
	}
	for _, wr := range writers {
		for _, a := range answers {
			t.Run(wr.name+"/"+a.name, func(t *testing.T) {
				m := conformance.NewMiddleware(t)
				var runs atomic.Int64
				var logged []int
				e := newEcho()
				e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
					return func(c echo.Context) error {
						err := next(c)
						logged = append(logged, c.Response().Status)
						return err
					}
				})
				e.POST("/o", func(c echo.Context) error {
					runs.Add(1)
					res := c.Response()
					if a.committed {
						res.Header().Set("Content-Type", "text/plain")
						res.WriteHeader(a.status)
					}
					if _, _, err := res.Hijack(); err == nil {
						t.Fatal("Hijack succeeded")
					}
					if _, _, err := http.NewResponseController(res).Hijack(); err == nil {
						t.Fatal("ResponseController.Hijack succeeded")
					}
					if res.Committed != a.committed {
						t.Errorf("after the failed Hijack: Committed %v, want %v", res.Committed, a.committed)
					}
					err := a.answer(c)
					if err == nil && (res.Status != a.status || !res.Committed) {
						t.Errorf("c.Response(): Status %d, Committed %v, want %d, true", res.Status, res.Committed, a.status)
					}
					return err
				}, echoidem.Middleware(m))
				post := func() *httptest.ResponseRecorder {
					rec := httptest.NewRecorder()
					req := httptest.NewRequest(http.MethodPost, "/o", strings.NewReader("{}"))
					req.Header.Set("Idempotency-Key", "k")
					e.ServeHTTP(wr.wrap(rec), req)
					return rec
				}
				for i, want := range []string{"", "true"} {
					rec := post()
					if rec.Code != a.status || rec.Body.String() != a.body ||
						rec.Header().Get("Content-Type") != a.contentType || rec.Header().Get("Idempotent-Replayed") != want {
						t.Errorf("request %d: %d %q %q replayed=%q, want %d %q %q replayed=%q", i+1, rec.Code,
							rec.Header().Get("Content-Type"), rec.Body, rec.Header().Get("Idempotent-Replayed"), a.status, a.contentType, a.body, want)
					}
				}
				if n := runs.Load(); n != 1 {
					t.Errorf("handler ran %d times, want 1", n)
				}
				if want := []int{a.status, a.status}; !slices.Equal(logged, want) {
					t.Errorf("outer middleware saw c.Response().Status %v, want %v", logged, want)
				}
			})
		}
	}
}
