// Command gateway puts idem in front of a service that knows nothing of
// it: a reverse proxy whose POST and PATCH requests with an Idempotency-Key
// reach the upstream once, and whose retries get the stored response.
//
//	go run ./examples/gateway -upstream http://localhost:9000            # listen on localhost:8080
//	go run ./examples/gateway -upstream http://localhost:9000 -redis localhost:6379
//
// Without -upstream it starts a small upstream of its own that counts the
// requests it serves, so the effect shows at once:
//
//	go run ./examples/gateway
//	curl -i -X POST localhost:8080/orders -H 'Idempotency-Key: k1' -d '{}'   # twice: same answer, upstream ran once
//
// The route that scopes records is the URL path: a proxy has no route
// patterns. Records are scoped by the Authorization header by default; a
// gateway that authenticates otherwise must set idem.WithScope.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/demo"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
)

func main() {
	log.SetFlags(0)
	addr := flag.String("addr", "localhost:8080", "listen address")
	upstream := flag.String("upstream", "", "upstream base URL; default: a counting upstream started here")
	redisAddr := flag.String("redis", "", "Redis address (host:port); default: the in-memory store")
	flag.Parse()

	if *upstream == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		go http.Serve(ln, countingUpstream())
		*upstream = "http://" + ln.Addr().String()
	}
	target, err := url.Parse(*upstream)
	if err != nil || target.Host == "" {
		log.Fatalf("-upstream %q: not an absolute URL", *upstream)
	}
	store, closeStore := demo.OpenStore(*redisAddr)
	h, m, err := newGateway(store, target)
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("gateway on http://%s -> %s", ln.Addr(), target)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)

	// A deploy stops the gateway with SIGTERM: the server first (the
	// requests in flight finish), then the middleware (their records are
	// stored), then the store.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	<-ctx.Done()
	stop()
	if err := demo.Shutdown(srv, closeStore, 30*time.Second, m); err != nil {
		log.Fatal(err)
	}
}

// newGateway returns a reverse proxy to target, protected by idem, and the
// middleware that protects it.
func newGateway(store storage.Store, target *url.URL) (http.Handler, *idem.Middleware, error) {
	m, err := idem.New(store,
		// The upstream may be slow: a duplicate waits for the first
		// request's answer instead of getting 409 at once.
		idem.WithWait(10*time.Second),
	)
	if err != nil {
		return nil, nil, err
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.SetXForwarded()
		},
		// An unreachable upstream answers 502: not stored, so a retry
		// tries the upstream again.
	}
	return nethttp.Middleware(m)(proxy), m, nil
}

// countingUpstream answers every request with how many it has served.
func countingUpstream() http.Handler {
	var n atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "{\"upstream_requests\":%d,\"path\":%q}\n", n.Add(1), r.URL.Path)
	})
}
