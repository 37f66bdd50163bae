package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
)

// routeOptions are the middleware options of a route.
func routeOptions(r *Route) []idem.Option {
	opts := []idem.Option{
		idem.WithMethods(r.Protect...),
		idem.WithLease(r.Lease),
		idem.WithTTL(r.TTL),
		idem.WithWait(r.Wait),
		idem.WithMaxRequestBody(r.MaxRequestBody),
		idem.WithMaxResponseBody(r.MaxResponseBody),
	}
	switch {
	case r.Key.Header != "":
		opts = append(opts, idem.WithHeader(r.Key.Header))
	case r.Key.JSON != "":
		opts = append(opts, idem.WithKey(idem.KeyFromJSON(strings.Split(r.Key.JSON, ".")...)))
	case r.Key.Form != "":
		opts = append(opts, idem.WithKey(idem.KeyFromForm(strings.Split(r.Key.Form, ",")...)))
	}
	if r.RequireKey {
		opts = append(opts, idem.WithRequireKey())
	}
	if s := r.Scope; s != nil {
		switch {
		case s.Header != "":
			name := s.Header
			opts = append(opts, idem.WithScope(func(r *http.Request) string { return r.Header.Get(name) }))
		case s.Authorization:
			opts = append(opts, idem.WithScope(idem.AuthorizationScope))
		case s.None:
			opts = append(opts, idem.WithScope(func(*http.Request) string { return "" }))
		}
	}
	if len(r.Cacheable) > 0 {
		var ranges [][2]int
		for _, c := range r.Cacheable {
			lo, hi, _ := statusRange(c)
			ranges = append(ranges, [2]int{lo, hi})
		}
		opts = append(opts, idem.WithCacheable(func(status int) bool {
			for _, rg := range ranges {
				if status >= rg[0] && status <= rg[1] {
					return true
				}
			}
			return false
		}))
	}
	if r.Fingerprint != nil {
		if *r.Fingerprint {
			opts = append(opts, idem.WithFingerprint(defaultFingerprint))
		} else {
			opts = append(opts, idem.WithoutFingerprint())
		}
	}
	return opts
}

// defaultFingerprint is what identifies the same request when a route
// asks for a fingerprint with a json or form key: as the middleware's
// default, the method, path, query, Content-Type and body.
func defaultFingerprint(r *http.Request, body []byte) string {
	var b strings.Builder
	b.WriteString(r.Method)
	b.WriteByte(0)
	b.WriteString(r.URL.EscapedPath())
	b.WriteByte(0)
	b.WriteString(r.URL.RawQuery)
	b.WriteByte(0)
	b.WriteString(r.Header.Get("Content-Type"))
	b.WriteByte(0)
	b.Write(body)
	return b.String()
}

// routes is one loaded configuration's handler: a ServeMux of the routes,
// and the middlewares that protect them, to shut down once no request
// uses them.
type routes struct {
	mux         *http.ServeMux
	middlewares []*idem.Middleware
	unwatch     []func() // stops idemotel's count of a middleware's executions
	transports  []*http.Transport
	verifiers   []*jwtVerifier
}

// buildRoutes builds the handler of c's routes on store, reported to tel.
// ctx bounds the first fetch of a route's jwks_url.
func buildRoutes(ctx context.Context, c *Config, store storage.Store, tel *idemotel.Telemetry, log *slog.Logger) (*routes, error) {
	rs := &routes{mux: http.NewServeMux()}
	transports := map[string]*http.Transport{} // one pool of connections an upstream
	for _, name := range sortedKeys(c.Upstreams) {
		transports[name] = newTransport(c.Upstreams[name])
		rs.transports = append(rs.transports, transports[name])
	}
	for i, r := range c.Routes {
		p := newProxy(c.Upstreams[r.Upstream], transports[r.Upstream], log, r.MaxResponseBody)
		if len(r.Protect) == 0 {
			rs.mux.Handle(r.Match, p) // a plain proxy route
			continue
		}
		logOutcome := observer(log, i, r)
		m, err := idem.New(store, append(routeOptions(r), idem.WithObserver(func(ev idem.Event) {
			tel.Observe(ev)
			logOutcome(ev)
		}))...)
		if err != nil {
			rs.close(context.Background())
			return nil, err
		}
		rs.middlewares = append(rs.middlewares, m)
		rs.unwatch = append(rs.unwatch, tel.Watch(m))
		h := nethttp.Middleware(m)(p)
		switch {
		case r.Scope != nil && r.Scope.Header != "":
			h = requireScope(r.Scope.Header, protects(r), h)
		case r.Scope != nil && r.Scope.JWT != nil:
			v, err := newJWTVerifier(ctx, r.Scope.JWT, nil)
			if err != nil {
				rs.close(context.Background())
				return nil, fmt.Errorf("routes[%d].scope.jwt: %w", i, err)
			}
			v.OnRefreshError(func(err error) {
				log.Warn("jwks_url refresh failed; the keys fetched before stay in use", "route", i, "err", err.Error())
			})
			rs.verifiers = append(rs.verifiers, v)
			h = requireJWT(v, protects(r), h)
		}
		rs.mux.Handle(r.Match, h)
	}
	// What no route matches gets a 404 problem; unless a route of the
	// file is "/" itself, which the mux refuses to have twice.
	register(rs.mux, "/", problemHandler(http.StatusNotFound, "No route", "no route of the gateway matches this request"))
	return rs, nil
}

// protects returns whether route r protects method.
func protects(r *Route) func(method string) bool {
	return func(method string) bool {
		for _, m := range r.Protect {
			if m == method {
				return true
			}
		}
		return false
	}
}

// close shuts the routes' middlewares down: it waits, until ctx ends, for
// the executions they started to end and their records to be stored.
func (rs *routes) close(ctx context.Context) error {
	var errs []error
	for _, m := range rs.middlewares {
		errs = append(errs, m.Shutdown(ctx))
	}
	for _, t := range rs.transports {
		t.CloseIdleConnections()
	}
	for _, unwatch := range rs.unwatch {
		unwatch()
	}
	for _, v := range rs.verifiers {
		v.Close()
	}
	return errors.Join(errs...)
}

// newProxy returns a route's reverse proxy to an upstream, through t.
//
// A protected request is proxied to its end even when its client goes
// away: its upstream call is not canceled with the client's request (it
// is bounded by the upstream's timeout instead), a response without
// Content-Length is read whole before it is passed on when it fits
// max_response_body, so that the record knows it is complete, and the
// response is copied whole into the record when the client cannot take
// it any more. The retry of a client that timed out then gets the
// upstream's response, stored, rather than a 409 for an outcome unknown.
func newProxy(u *Upstream, t *http.Transport, log *slog.Logger, maxBody int) http.Handler {
	target, _ := url.Parse(u.URL) // validated
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.SetXForwarded()
		},
		ModifyResponse: func(res *http.Response) error {
			// A protected response of unknown length is read whole first
			// (up to maxBody), so that its record knows it is complete;
			// not a 1xx (an upgrade's body is the connection) nor an
			// answer without a body.
			info, _ := idem.FromContext(res.Request.Context())
			if !info.Protected || res.StatusCode < 200 || res.StatusCode == http.StatusNoContent ||
				res.StatusCode == http.StatusNotModified || res.Request.Method == http.MethodHead {
				return nil
			}
			if res.ContentLength < 0 {
				return readWhole(res, maxBody)
			}
			if len(res.Trailer) > 0 {
				// Trailers announced with a Content-Length (HTTP/2 allows
				// both): without the length the client gets the body
				// chunked, with the trailers, as the record's replay sends
				// it; with it, net/http would drop them.
				res.Header.Del("Content-Length")
			}
			return nil
		},
		Transport: nethttp.ProxyTransport(t),
		// FlushInterval 0: ReverseProxy passes streams on as they come
		// (text/event-stream, and answers of unknown length, which a
		// protected request's never is: see readWhole), and holds a small
		// answer of known length until the handler returns, that is until
		// its record is stored: a client that retries the moment it has
		// its answer finds the record, not the execution in flight.
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
				log.Debug("client went away while the upstream worked", "method", r.Method, "route", r.Pattern)
			} else {
				log.Warn("upstream failed", "method", r.Method, "route", r.Pattern, "err", err.Error())
			}
			writeProblem(w, http.StatusBadGateway, "Bad gateway", "the upstream could not be reached, or failed to answer")
		},
	}
	return &proxy{rp: rp, timeout: u.Timeout}
}

// newTransport returns the pool of connections to an upstream.
func newTransport(u *Upstream) *http.Transport {
	dialer := &net.Dialer{Timeout: u.DialTimeout, KeepAlive: 30 * time.Second}
	t := &http.Transport{
		Proxy:                 nil, // never a proxy from the environment: the upstream is named
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          u.MaxIdleConns,
		MaxIdleConnsPerHost:   u.MaxIdleConns,
		MaxConnsPerHost:       u.MaxConns,
		IdleConnTimeout:       u.IdleConnTimeout,
		ResponseHeaderTimeout: u.ResponseHeaderTimeout,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	if u.H2C {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		t.Protocols = &p
	}
	return t
}

// proxy is a reverse proxy whose protected requests outlive their clients.
type proxy struct {
	rp      *httputil.ReverseProxy
	timeout time.Duration
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if info, _ := idem.FromContext(ctx); info.Protected {
		ctx = context.WithoutCancel(ctx)
		w = &keepWriting{ResponseWriter: w}
	}
	if p.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.timeout)
		defer cancel()
	}
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

// keepWriting is the writer of a protected request's proxy: a client that
// went away does not stop the copy of the upstream's response, which the
// middleware's record keeps whole.
type keepWriting struct{ http.ResponseWriter }

func (k *keepWriting) Write(p []byte) (int, error) {
	k.ResponseWriter.Write(p) // the record keeps p even when the client is gone
	return len(p), nil
}

func (k *keepWriting) FlushError() error {
	http.NewResponseController(k.ResponseWriter).Flush()
	return nil
}

func (k *keepWriting) Unwrap() http.ResponseWriter { return k.ResponseWriter }

// readWhole reads a response body of unknown length whole, when it has at
// most limit bytes, and gives the response its Content-Length; a longer
// body is passed on as it comes (its record will not be kept). A body
// followed by trailers (announced by the Trailer header or not) keeps no
// Content-Length: the client gets it chunked, with its trailers, as the
// record's replay sends it (HTTP/1.1 has trailers only after a chunked
// body). A read that fails returns its error, for the proxy's 502; the
// upstream answered, so ProxyTransport has marked the execution done:
// retries get 409, never a second call.
func readWhole(res *http.Response, limit int) error {
	buf, err := io.ReadAll(io.LimitReader(res.Body, int64(limit)+1))
	if err != nil {
		return err
	}
	if len(buf) > limit {
		res.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(buf), res.Body), res.Body}
		return nil
	}
	res.Body.Close() // res.Trailer now holds the trailers that came
	res.Body = io.NopCloser(bytes.NewReader(buf))
	res.ContentLength = int64(len(buf)) // known: ReverseProxy passes it on without flushing
	if len(res.Trailer) == 0 {
		res.Header.Set("Content-Length", strconv.Itoa(len(buf)))
		res.TransferEncoding = nil
	}
	return nil
}

// requireScope answers 401 to a protected request without the scope
// header: the proxy in front names every principal, so a request without
// one did not come through it.
func requireScope(header string, protected func(string) bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if protected(r.Method) && r.Header.Get(header) == "" {
			writeProblem(w, http.StatusUnauthorized, "No principal",
				"this route scopes its records by the "+header+" header, which the request does not carry")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// requireJWT answers 401 to a protected request without a bearer token
// that v accepts, and names the token's principal in the context of the
// others: the middleware's default scope.
func requireJWT(v *jwtVerifier, protected func(string) bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !protected(r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		principal, err := v.Principal(r)
		if err != nil {
			// RFC 6750: the error says why, never the token or a claim.
			challenge := `Bearer`
			if !errors.Is(err, errNoToken) {
				challenge = `Bearer error="invalid_token", error_description=` + strconv.Quote(err.Error())
			}
			w.Header().Set("WWW-Authenticate", challenge)
			writeProblem(w, http.StatusUnauthorized, "Invalid bearer token", err.Error())
			return
		}
		next.ServeHTTP(w, r.WithContext(idem.ContextWithPrincipal(r.Context(), principal)))
	})
}

// problemHandler answers every request with one problem.
func problemHandler(status int, title, detail string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { writeProblem(w, status, title, detail) })
}

// writeProblem writes an RFC 9457 problem of the gateway's own.
func writeProblem(w http.ResponseWriter, status int, title, detail string) {
	body, _ := json.Marshal(map[string]any{"type": "about:blank", "title": title, "status": status, "detail": detail})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// observer logs the outcomes that matter, one line each: never a key, a
// scope or a body (an Event holds none).
func observer(log *slog.Logger, i int, r *Route) func(idem.Event) {
	return func(ev idem.Event) {
		level := slog.LevelDebug
		switch ev.Outcome {
		case idem.StoreError, idem.LeaseLost:
			level = slog.LevelError
		case idem.NotReplayable, idem.Mismatch, idem.Rejected:
			level = slog.LevelWarn
		case idem.Executed, idem.Replayed, idem.Conflict, idem.Released, idem.Rebuilt:
			level = slog.LevelInfo
		}
		if !log.Enabled(ev.Context, level) {
			return
		}
		attrs := []slog.Attr{
			slog.String("outcome", ev.Outcome.String()),
			slog.Int("route", i),
			slog.String("match", r.Match),
			slog.String("method", ev.Method),
			slog.Int("status", ev.Status),
			slog.Duration("duration", ev.Duration),
		}
		if ev.Handler > 0 {
			attrs = append(attrs, slog.Duration("upstream", ev.Handler))
		}
		if ev.Retries > 0 {
			attrs = append(attrs, slog.Int("retries", ev.Retries))
		}
		if ev.Err != nil {
			attrs = append(attrs, slog.String("err", ev.Err.Error()))
		}
		log.LogAttrs(ev.Context, level, "request", attrs...)
	}
}
