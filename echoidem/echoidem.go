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
	"net/http"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/response"
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
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if cfg.Skipper(c) {
				return next(c)
			}
			var err error
			m.Serve(c.Response(), c.Request(), route(c), func(w http.ResponseWriter, r *http.Request) {
				c.SetRequest(r)
				cw, ok := w.(*response.Capture)
				if !ok { // not protected: w is c.Response()
					err = next(c)
					return
				}
				// cw writes to the original Response; the handlers get a
				// new one on top of cw.
				orig := c.Response()
				res := echo.NewResponse(cw, c.Echo())
				res.Status = http.StatusOK
				c.SetResponse(res)
				defer c.SetResponse(orig)
				if herr := next(c); herr != nil {
					c.Error(herr) // rendered into cw, so it is recorded
				}
			})
			return err
		}
	}
}

// route returns the route pattern Echo matched, or "" when its router found
// no route for the request's method. c.Path() alone does not tell: it is ""
// for a plain 404, but holds a pattern for a 405 (a route exists for other
// methods) and for a route registered with RouteNotFound, which Group.Use
// registers for every group that has middleware ("/api/*").
func route(c echo.Context) string {
	p := c.Path()
	if p == "" || c.Get(echo.ContextKeyHeaderAllow) != nil {
		return ""
	}
	e := c.Echo()
	rt, ok := e.Routers()[c.Request().Host]
	if !ok {
		rt = e.Router()
	}
	notFound := false
	for _, r := range rt.Routes() {
		switch {
		case r.Path != p:
		case r.Method == c.Request().Method:
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
