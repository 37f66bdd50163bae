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
// A proxied request whose outcome is unknown is never sent to the upstream
// twice. When the upstream cannot be reached (the connection was refused,
// nothing was written), the gateway answers 502 and the key is released,
// so a retry tries again. When the round trip fails after the request went
// out (a timeout, a reset, the client giving up while the upstream works),
// the upstream may have acted on it: the gateway marks the execution done
// with idem.MarkDone before answering 502, and retries get 409 instead of
// a second upstream call. A client that goes away while the upstream's
// answer is being copied makes the proxy panic with http.ErrAbortHandler
// after the status went out, and the middleware keeps that key done too.
// And a protected request without a body is sent so that Go's transport
// does not resend it by itself, as it would when a reused connection
// closes before the answer: its Idempotency-Key header tells the
// transport that a resend is safe.
//
// The route that scopes records is the URL path: a proxy has no route
// patterns. Records are scoped by the Authorization header, whole
// (idem.AuthorizationScope): a gateway that does not verify credentials
// itself has no principal to name, and its clients' credentials are
// static API keys. Behind a gateway that verifies tokens, name the
// principal with idem.ContextWithPrincipal instead.
package main

import (
	"context"
	"errors"
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
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

func main() {
	log.SetFlags(0)
	addr := flag.String("addr", "localhost:8080", "listen address")
	upstream := flag.String("upstream", "", "upstream base URL; default: a counting upstream started here")
	redisAddr := flag.String("redis", "", "Redis address (host:port); default: the in-memory store")
	flag.Parse()
	if err := run(*addr, *upstream, *redisAddr); err != nil {
		log.Fatal(err)
	}
}

// run serves the gateway until SIGINT or SIGTERM, then shuts down in the
// order a deploy needs.
func run(addr, upstream, redisAddr string) error {
	if upstream == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		go http.Serve(ln, countingUpstream())
		upstream = "http://" + ln.Addr().String()
	}
	target, err := url.Parse(upstream)
	if err != nil || target.Host == "" {
		return fmt.Errorf("-upstream %q: not an absolute URL", upstream)
	}
	var store storage.Store
	if redisAddr == "" {
		ms := memstore.New()
		defer ms.Close() // 3. the store, last
		store = ms
	} else {
		rdb := redis.NewClient(redisstore.ClientOptions(redisAddr))
		defer rdb.Close()
		store = redisstore.New(rdb)
	}
	h, m, err := newGateway(store, target)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	log.Printf("gateway on http://%s -> %s", ln.Addr(), target)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)

	// A deploy stops the gateway with SIGTERM: 1. the server (the
	// requests in flight finish), 2. the middleware (their records are
	// stored), 3. the store (deferred).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	<-ctx.Done()
	stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return errors.Join(srv.Shutdown(ctx), m.Shutdown(ctx))
}

// newGateway returns a reverse proxy to target, protected by idem, and the
// middleware that protects it.
func newGateway(store storage.Store, target *url.URL) (http.Handler, *idem.Middleware, error) {
	m, err := idem.New(store,
		// The upstream may be slow: a duplicate waits for the first
		// request's answer instead of getting 409 at once.
		idem.WithWait(10*time.Second),
		// This gateway does not authenticate: the upstream does. It has
		// no principal to name, and the default scope would refuse a
		// request with credentials (ErrScopeUnknown). The header, whole,
		// is the honest scope for credentials that never change between
		// retries (static API keys); a client whose token is refreshed
		// between two attempts lands in another scope and is proxied
		// again. A gateway that verifies tokens names the token's subject
		// with idem.ContextWithPrincipal instead.
		idem.WithScope(idem.AuthorizationScope),
	)
	if err != nil {
		return nil, nil, err
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.SetXForwarded()
		},
		// A round trip that fails answers 502: released when the request
		// never went out (a retry tries the upstream again), kept as done
		// when it did (see nethttp.ProxyTransport).
		Transport: nethttp.ProxyTransport(nil),
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
