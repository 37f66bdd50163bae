package nethttp_test

import (
	"net/http"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/tests/conformance"
	"github.com/idemkit/idem/nethttp"
)

// recoverer answers 500 to a panic, as an application's recovery
// middleware would; it sits outside the idem middleware.
func recoverer(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				http.Error(w, "internal error", http.StatusInternalServerError)
			}
		}()
		h.ServeHTTP(w, r)
	})
}

func TestConformance(t *testing.T) {
	t.Run("per-route", func(t *testing.T) {
		conformance.Run(t, conformance.Adapter{Name: "nethttp", Mount: func(m *idem.Middleware, routes ...conformance.Route) http.Handler {
			mux := http.NewServeMux()
			for _, rt := range routes {
				mux.Handle(rt.Method+" "+rt.Pattern, nethttp.Middleware(m)(rt.Handler))
			}
			return recoverer(mux)
		}})
	})
	t.Run("whole-mux", func(t *testing.T) {
		conformance.Run(t, conformance.Adapter{Name: "nethttp-mux", Mount: func(m *idem.Middleware, routes ...conformance.Route) http.Handler {
			mux := http.NewServeMux()
			for _, rt := range routes {
				mux.Handle(rt.Method+" "+rt.Pattern, rt.Handler)
			}
			return recoverer(nethttp.Middleware(m)(mux))
		}})
	})
}
