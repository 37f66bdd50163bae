package nethttp_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/memstore"
)

// A reverse proxy in front of a service that knows nothing of idem: its
// retries reach the service once. ProxyTransport keeps a request whose
// outcome is unknown (it went out, then the round trip failed) from being
// released for a second call. cmd/idem-gateway is this, as a binary.
func ExampleProxyTransport() {
	var orders atomic.Int64
	service := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d\n", orders.Add(1))
	}))
	defer service.Close()
	target, _ := url.Parse(service.URL)

	store := memstore.New()
	defer store.Close()
	// A proxy that does not authenticate has no principal to name: the
	// Authorization header, whole, scopes static API keys.
	m, err := idem.New(store, idem.WithScope(idem.AuthorizationScope))
	if err != nil {
		log.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport: nethttp.ProxyTransport(nil), // http.DefaultTransport, made safe for protected requests
	}
	gateway := httptest.NewServer(nethttp.Middleware(m)(proxy))
	defer gateway.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, gateway.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Idempotency-Key", "k1")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Printf("%d %s", res.StatusCode, body)
	}
	fmt.Println("orders placed:", orders.Load())
	// Output:
	// 201 order 1
	// 201 order 1
	// orders placed: 1
}
