// Package nethttp adapts the idem middleware to net/http.
//
//	m, err := idem.New(memstore.New())
//	mux := http.NewServeMux()
//	mux.Handle("POST /orders", nethttp.Middleware(m)(createOrder))
//
// The route that scopes a record is the ServeMux pattern ("POST /orders"):
// Request.Pattern when the middleware wraps a handler registered on a mux,
// or the pattern the mux would choose when it wraps the mux itself. A
// request the mux answers itself passes through untouched and is never
// stored: its 404 and 405, and its redirects (to the path with a trailing
// slash when only "/orders/" is registered, or to the cleaned path), which
// the client follows with the same key; so does a route whose handler is an
// http.RedirectHandler. Around any other handler the route is the URL path.
package nethttp

import (
	"net/http"
	"reflect"

	"github.com/idemkit/idem"
)

// Middleware returns net/http middleware that runs each protected request
// through m. Wrap one handler or a whole *http.ServeMux. It panics if m is
// nil.
func Middleware(m *idem.Middleware) func(http.Handler) http.Handler {
	if m == nil {
		panic("nethttp: nil *idem.Middleware")
	}
	return func(next http.Handler) http.Handler {
		mux, _ := next.(*http.ServeMux)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.Serve(w, r, route(mux, r), next.ServeHTTP)
		})
	}
}

// redirectType is the type of the handler a ServeMux answers its own
// redirects with.
var redirectType = reflect.TypeOf(http.RedirectHandler("/", http.StatusMovedPermanently))

// route names the request's route: its mux pattern, "" when the mux has
// none for it or answers it with a redirect of its own, or the URL path
// when there is no mux to ask.
func route(mux *http.ServeMux, r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	if mux != nil {
		h, pattern := mux.Handler(r)
		if reflect.TypeOf(h) == redirectType {
			return ""
		}
		return pattern
	}
	return r.URL.Path
}
