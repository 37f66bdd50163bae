// Package echoidem adapts the idem middleware to Echo v4.
//
//	m, err := idem.New(memstore.New())
//	if err != nil {
//		log.Fatal(err)
//	}
//	e := echo.New()
//	e.Use(middleware.RequestLogger(), middleware.Recover(), echoidem.Middleware(m))
//	e.POST("/orders", createOrder)
//
// Put the middleware inside middleware.Recover, so that a panicking handler
// releases the key before Recover answers 500, and inside the logger, so
// the log shows the final status, replays and refusals included. It may
// also be given to a single route or group: e.POST("/orders", createOrder,
// echoidem.Middleware(m)).
//
// Register it with Use (or on a group or route), not with Pre: before
// routing there is no route, and every request would pass through.
//
// The route that scopes a record is c.Path() ("/orders/:id"). A request
// that matched no route passes through untouched, so Echo's 404 and 405
// answers are never stored; this includes routes registered with
// RouteNotFound and the catch-all 404 route that Group.Use registers.
//
// # Errors returned by handlers
//
// A handler that returns an error writes nothing: Echo's HTTPErrorHandler
// renders it after the whole middleware chain has returned, too late to be
// recorded. So, for a protected request, the middleware renders a returned
// error itself by calling c.Error (as Echo's BodyDump middleware does) and
// then returns nil: echo.NewHTTPError(402, "declined") is recorded and
// replayed byte for byte like any 402, and an error that becomes a 5xx
// releases the key so that a retry runs the handler again. The middleware
// and the handlers after it therefore report such an error to the error
// handler, not to the middleware before it; a logger placed before the
// middleware still sees the final status in c.Response().Status.
//
// While a protected handler runs, c.Response() is a fresh *echo.Response
// whose Writer records the response (as Echo's own WrapMiddleware does);
// the original Response, which the middleware before it registered its
// Before and After hooks on, receives everything, and is restored when the
// handler returns or panics.
package echoidem

import (
	"maps"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/idemkit/idem"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// Config configures [MiddlewareWithConfig].
type Config struct {
	// Skipper, when it returns true, makes the request bypass the
	// middleware entirely. Default: middleware.DefaultSkipper, which skips
	// nothing.
	Skipper middleware.Skipper

	// Middleware runs the idempotency protocol. Required.
	Middleware *idem.Middleware
}

// DefaultConfig is the default configuration; Middleware must still be set.
var DefaultConfig = Config{
	Skipper: middleware.DefaultSkipper,
}

// Middleware returns Echo middleware that runs each protected request
// through m, with the defaults of [DefaultConfig]. It panics if m is nil.
func Middleware(m *idem.Middleware) echo.MiddlewareFunc {
	c := DefaultConfig
	c.Middleware = m
	return MiddlewareWithConfig(c)
}

// MiddlewareWithConfig returns Echo middleware configured by cfg. A nil
// Skipper means DefaultConfig.Skipper. It panics if cfg.Middleware is nil,
// as Echo's own constructors do for a required setting.
func MiddlewareWithConfig(cfg Config) echo.MiddlewareFunc {
	if cfg.Middleware == nil {
		panic("echoidem: Config.Middleware is nil")
	}
	if cfg.Skipper == nil {
		cfg.Skipper = DefaultConfig.Skipper
	}
	m := cfg.Middleware
	known := newRouteCache()
	tmpl := new(atomic.Pointer[template])
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if cfg.Skipper(c) {
				return next(c)
			}
			x := call{c: c, next: next, tmpl: tmpl}
			m.Serve(c.Response(), c.Request(), known.route(c), x.serve)
			return x.err
		}
	}
}

// call is one request through the middleware.
type call struct {
	c    echo.Context
	next echo.HandlerFunc
	tmpl *atomic.Pointer[template]
	err  error // what next returned, for a request that is not protected
}

// serve is the handler that Middleware.Serve runs.
func (x *call) serve(w http.ResponseWriter, r *http.Request) {
	c := x.c
	c.SetRequest(r)
	orig := c.Response()
	if w == http.ResponseWriter(orig) { // not protected
		x.err = x.next(c)
		return
	}
	// w, the middleware's writer, writes to the original Response; the
	// handlers get a new one on top of w.
	res := x.newResponse(w)
	c.SetResponse(res)
	defer c.SetResponse(orig)
	if herr := x.next(c); herr != nil {
		c.Error(herr) // rendered into w, so it is recorded
	}
	// Like Echo's own Context, the Response is reused once the handlers
	// have returned (not after a panic).
	*res = echo.Response{}
	responsePool.Put(res)
}

// newResponse returns a Response writing to w, as echo.NewResponse does,
// from responsePool. A fresh Response of c.Echo() is kept as a template
// so that making one allocates nothing.
func (x *call) newResponse(w http.ResponseWriter) *echo.Response {
	e := x.c.Echo()
	t := x.tmpl.Load()
	if t == nil || t.e != e {
		t = &template{e: e, res: *echo.NewResponse(nil, e)}
		x.tmpl.Store(t)
	}
	res := responsePool.Get().(*echo.Response)
	*res = t.res
	res.Writer, res.Status = w, http.StatusOK
	return res
}

// template is a fresh Response of one Echo.
type template struct {
	e   *echo.Echo
	res echo.Response
}

// responsePool holds the Responses of finished executions.
var responsePool = sync.Pool{New: func() any { return new(echo.Response) }}

// route returns the route pattern Echo matched, or "" when its router found
// no route for the request's method. c.Path() alone does not tell: it is ""
// for a plain 404, but holds a pattern for a 405 (a route exists for other
// methods) and for a route registered with RouteNotFound, which Group.Use
// registers for every group that has middleware ("/api/*"). route
// allocates nothing once it has indexed the router's routes.
func (known *routeCache) route(c echo.Context) string {
	p := c.Path()
	if p == "" || c.Get(echo.ContextKeyHeaderAllow) != nil {
		return ""
	}
	e := c.Echo()
	rt, ok := e.Routers()[c.Request().Host]
	if !ok {
		rt = e.Router()
	}
	method := c.Request().Method
	ix := known.index(rt)
	if ix == nil { // the routes cannot be counted: scan them
		return scanRoutes(rt, method, p)
	}
	if _, ok := ix.routes[routeKey{method, p}]; ok {
		return p
	}
	if _, ok := ix.notFound[p]; ok {
		return ""
	}
	return p
}

// scanRoutes is route for a router whose routes route cannot index.
func scanRoutes(rt *echo.Router, method, p string) string {
	notFound := false
	for _, r := range rt.Routes() {
		switch {
		case r.Path != p:
		case r.Method == method:
			return p
		case r.Method == echo.RouteNotFound:
			notFound = true
		}
	}
	if notFound {
		return ""
	}
	return p
}

// routeCache holds an index of the routes of each router the middleware
// serves, the routes Router.Routes lists, so that route finds a request's
// route without building that list on every request. Echo cannot remove a
// route, and adding one (not just replacing a route's handler) adds an
// entry to the map behind Routes: an index stays exact while that map has
// the length it had when the index was built, and is rebuilt otherwise.
type routeCache struct {
	mu      sync.Mutex                                   // serializes rebuilds
	indexes atomic.Pointer[map[*echo.Router]*routeIndex] // copied on write
}

func newRouteCache() *routeCache { return new(routeCache) }

// routeIndex is what Router.Routes listed when it had n routes.
type routeIndex struct {
	n        int
	routes   map[routeKey]struct{} // method and path of each route
	notFound map[string]struct{}   // paths with a RouteNotFound route
}

type routeKey struct{ method, path string }

// index returns the index of rt's current routes, or nil if they cannot be
// counted.
func (known *routeCache) index(rt *echo.Router) *routeIndex {
	n := routeCount(rt)
	if n < 0 {
		return nil
	}
	if m := known.indexes.Load(); m != nil {
		if ix := (*m)[rt]; ix != nil && ix.n == n {
			return ix
		}
	}
	known.mu.Lock()
	defer known.mu.Unlock()
	old := known.indexes.Load()
	if old != nil {
		if ix := (*old)[rt]; ix != nil && ix.n == n {
			return ix
		}
	}
	routes := rt.Routes()
	ix := &routeIndex{n: n, routes: make(map[routeKey]struct{}, len(routes)), notFound: make(map[string]struct{})}
	for _, r := range routes {
		ix.routes[routeKey{r.Method, r.Path}] = struct{}{}
		if r.Method == echo.RouteNotFound {
			ix.notFound[r.Path] = struct{}{}
		}
	}
	m := make(map[*echo.Router]*routeIndex, 1)
	if old != nil {
		maps.Copy(m, *old)
	}
	m[rt] = ix
	known.indexes.Store(&m)
	return ix
}

// routesField is the index of Router's map of routes, the one Routes lists,
// or -1 if this version of Echo has none.
var routesField = func() int {
	f, ok := reflect.TypeFor[echo.Router]().FieldByName("routes")
	if !ok || len(f.Index) != 1 || f.Type.Kind() != reflect.Map {
		return -1
	}
	return f.Index[0]
}()

// routeCount returns the number of routes Router.Routes would list, without
// building the list (Echo has no other way to tell), or -1 if it cannot.
func routeCount(rt *echo.Router) int {
	if routesField < 0 {
		return -1
	}
	return reflect.ValueOf(rt).Elem().Field(routesField).Len()
}
