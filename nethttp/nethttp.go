// Package nethttp adapts the idem middleware to net/http.
//
//	m, err := idem.New(memstore.New())
//	mux := http.NewServeMux()
//	mux.Handle("POST /orders", nethttp.Middleware(m)(createOrder))
//
// The route that scopes a record is the ServeMux pattern ("POST /orders"):
// Request.Pattern when the middleware wraps a handler registered on a mux,
// or the pattern the mux would choose when it wraps the mux itself. A
// request the mux would answer 404 or 405 passes through untouched and is
// never stored. Around any other handler the route is the URL path.
package nethttp

import (
	"net/http"

	"github.com/idemkit/idem"
)

// Middleware returns net/http middleware that runs each protected request
// through m. Wrap one handler or a whole *http.ServeMux.
func Middleware(m *idem.Middleware) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		mux, _ := next.(*http.ServeMux)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.Serve(w, r, route(mux, r), next.ServeHTTP)
		})
	}
}

// route names the request's route: its mux pattern, "" when the mux has
// none for it, or the URL path when there is no mux to ask.
func route(mux *http.ServeMux, r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	if mux != nil {
		_, pattern := mux.Handler(r)
		return pattern
	}
	return r.URL.Path
}
