package echoidem

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/labstack/echo/v4"
)

// routeEcho returns an Echo with the kinds of routes route tells apart:
// plain and parameter routes, a 405 path, a RouteNotFound catch-all of its
// own and the one Group.Use registers, a route only on the tree
// (Router.Add, not listed by Routes) and, to make a scan costly, many more.
func routeEcho() *echo.Echo {
	e := echo.New()
	h := func(c echo.Context) error { return nil }
	e.POST("/orders", h)
	e.POST("/orders/:id", h)
	e.GET("/only-get", h)
	e.RouteNotFound("/files/*", h)
	g := e.Group("/api", func(next echo.HandlerFunc) echo.HandlerFunc { return next })
	g.POST("/orders", h)
	e.Router().Add(http.MethodPost, "/tree-only", h)
	for i := range 100 {
		e.GET("/filler/"+strconv.Itoa(i), h)
	}
	return e
}

// routeCases are requests and the route that route must return.
var routeCases = []struct {
	name, method, path, want string
}{
	{"route", http.MethodPost, "/orders", "/orders"},
	{"param route", http.MethodPost, "/orders/7", "/orders/:id"},
	{"group route", http.MethodPost, "/api/orders", "/api/orders"},
	{"plain 404", http.MethodPost, "/nope", ""},
	{"405", http.MethodPost, "/only-get", ""},
	{"RouteNotFound", http.MethodPost, "/files/x", ""},
	{"Group.Use catch-all", http.MethodPost, "/api/nope", ""},
	{"route only on the tree", http.MethodPost, "/tree-only", "/tree-only"},
}

// matched returns a context that e's router matched to method and path,
// as Echo's ServeHTTP does before the middleware runs.
func matched(e *echo.Echo, method, path string) echo.Context {
	c := e.NewContext(httptest.NewRequest(method, path, nil), httptest.NewRecorder())
	e.Router().Find(method, path, c)
	return c
}

func TestRoute(t *testing.T) {
	e := routeEcho()
	known := newRouteCache()
	var wg sync.WaitGroup
	for range 4 { // concurrent requests, on a cache filled by the first ones
		wg.Go(func() {
			for range 2 {
				for _, tc := range routeCases {
					if got := known.route(matched(e, tc.method, tc.path)); got != tc.want {
						t.Errorf("%s: route %q, want %q", tc.name, got, tc.want)
					}
				}
			}
		})
	}
	wg.Wait()
}

// A route added after requests were served counts from then on, at once:
// a catch-all turns its pattern's requests into pass-throughs, and a route
// for a method at a catch-all's pattern makes them protected again.
func TestRouteAddedLater(t *testing.T) {
	e := routeEcho()
	known := newRouteCache()
	h := func(c echo.Context) error { return nil }
	check := func(method, path, want string) {
		t.Helper()
		for range 2 {
			if got := known.route(matched(e, method, path)); got != want {
				t.Errorf("%s %s: route %q, want %q", method, path, got, want)
			}
		}
	}
	check(http.MethodPost, "/late/x", "")
	e.POST("/late/*", h)
	check(http.MethodPost, "/late/x", "/late/*")
	e.RouteNotFound("/late/*", h)
	check(http.MethodPost, "/late/x", "/late/*") // the POST route still wins
	check(http.MethodPatch, "/late/x", "")       // the catch-all answers PATCH
	e.PATCH("/late/*", h)
	check(http.MethodPatch, "/late/x", "/late/*")
	check(http.MethodPost, "/shop/x", "")
	e.RouteNotFound("/shop/*", h)
	check(http.MethodPost, "/shop/x", "")
	e.POST("/shop/*", h)
	check(http.MethodPost, "/shop/x", "/shop/*")
}

// route runs on every request: once a router's routes are known it
// allocates nothing, for a catch-all 404 route as for a registered route.
func TestRouteAllocs(t *testing.T) {
	if routesField < 0 {
		t.Fatal("echo.Router has no map of routes to count: route scans Routes on every request")
	}
	e := routeEcho()
	known := newRouteCache()
	for _, tc := range routeCases {
		c := matched(e, tc.method, tc.path)
		known.route(c) // fills the cache
		if n := testing.AllocsPerRun(100, func() { known.route(c) }); n != 0 {
			t.Errorf("%s: route allocates %v times per request, want 0", tc.name, n)
		}
	}
}

func BenchmarkRoute(b *testing.B) {
	e := routeEcho()
	known := newRouteCache()
	for _, tc := range routeCases {
		c := matched(e, tc.method, tc.path)
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				known.route(c)
			}
		})
	}
}
