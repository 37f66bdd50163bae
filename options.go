package idem

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Defaults of the options of [New].
const (
	DefaultHeader          = "Idempotency-Key"
	DefaultTTL             = 24 * time.Hour
	DefaultLease           = 30 * time.Second
	DefaultMaxRequestBody  = 1 << 20
	DefaultMaxResponseBody = 1 << 20
)

// Option configures a [Middleware]. An option given an invalid value makes
// New return an error wrapping ErrInvalidOption.
type Option func(*config) error

type config struct {
	header      string
	methods     []string
	requireKey  bool
	ttl         time.Duration
	lease       time.Duration
	wait        time.Duration
	scope       func(*http.Request) string // nil: the default (scopeOf)
	fingerprint func(r *http.Request, body []byte) string
	noFP        bool
	fpSet       bool // WithFingerprint or WithoutFingerprint was given
	keySource   KeySource
	maxReq      int64
	maxResp     int
	cacheable   func(status int) bool
	failOpen    bool
	errorWriter ErrorWriter
	observer    func(Event)
	omit        map[string]bool
	rebuild     func(w http.ResponseWriter, r *http.Request) bool
	issuedTTL   time.Duration // > 0: issued keys only (WithIssuedKeys)
	issueLimit  int           // keys a minute per scope (WithIssueLimit)
}

func defaultConfig() config {
	return config{
		header:      DefaultHeader,
		methods:     []string{http.MethodPost, http.MethodPatch},
		ttl:         DefaultTTL,
		lease:       DefaultLease,
		maxReq:      DefaultMaxRequestBody,
		maxResp:     DefaultMaxResponseBody,
		cacheable:   DefaultCacheable,
		errorWriter: WriteProblem,
		omit:        map[string]bool{"Set-Cookie": true},
		issueLimit:  DefaultIssueLimit,
	}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
}

// WithHeader sets the request header that carries the idempotency key.
// Default "Idempotency-Key". An empty name is invalid. grpcidem ignores it
// (its twin: grpcidem.WithKeyHeader).
func WithHeader(name string) Option {
	return func(c *config) error {
		if name == "" || strings.ContainsAny(name, " \t\r\n:") {
			return invalid("WithHeader(%q): not a header name", name)
		}
		c.header = http.CanonicalHeaderKey(name)
		return nil
	}
}

// WithMethods sets the HTTP methods the middleware protects; requests with
// other methods pass through untouched. Default POST and PATCH. Safe
// methods (GET, HEAD, OPTIONS, TRACE) and an empty list are invalid.
// grpcidem ignores it (its twin: grpcidem.WithMethods).
func WithMethods(methods ...string) Option {
	return func(c *config) error {
		if len(methods) == 0 {
			return invalid("WithMethods: no method")
		}
		c.methods = c.methods[:0:0]
		for _, m := range methods {
			m = strings.ToUpper(m)
			switch m {
			case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
				return invalid("WithMethods: %q is not a method to protect", m)
			}
			c.methods = append(c.methods, m)
		}
		return nil
	}
}

// WithRequireKey answers 400 (ErrMissingKey) to a protected request that
// carries no key. By default such a request passes through unprotected.
// grpcidem ignores it (its twin: grpcidem.WithRequireKey).
func WithRequireKey() Option {
	return func(c *config) error { c.requireKey = true; return nil }
}

// WithTTL sets how long a completed response is kept and replayed.
// Default 24 hours. It must be positive and at least the lease.
func WithTTL(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return invalid("WithTTL(%v): must be positive", d)
		}
		c.ttl = d
		return nil
	}
}

// WithLease sets how long a request holds its key while the handler runs.
// The lease is renewed every lease/3 while the handler runs, so it bounds
// only how long a key stays locked after its process died. A renewal that
// fails is tried again soon (a jittered backoff from lease/100 to lease/20,
// denser as the lease nears its end) until one succeeds or the lease has
// run out: a store outage that begins as a renewal falls due and is
// shorter than two thirds of the lease never lets a duplicate take the key
// from a handler still running. The lease also bounds how long the
// middleware retries storing a response when the store fails after the
// handler: there too, a store outage shorter than two thirds of the lease
// never costs a second execution; a store that cannot write for longer
// (down, or Redis at maxmemory answering OOM) cannot prevent one.
// Default 30 seconds; at least 30 milliseconds.
func WithLease(d time.Duration) Option {
	return func(c *config) error {
		if d < 30*time.Millisecond {
			return invalid("WithLease(%v): must be at least 30ms", d)
		}
		c.lease = d
		return nil
	}
}

// WithWait makes a duplicate that arrives while the first request is in
// flight wait up to d for it to finish, then get its response (or run the
// handler, if the first released the key), instead of an immediate 409.
// A duplicate whose own context ends while it waits (its client gave up)
// stops waiting: outcome Canceled, 503 ErrCanceled, never a run of the
// handler. Default 0: no waiting. Negative is invalid.
func WithWait(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return invalid("WithWait(%v): must not be negative", d)
		}
		c.wait = d
		return nil
	}
}

// WithScope sets the function that names the principal (user, tenant, API
// client) a request acts for. Records of different scopes never meet, so
// two clients choosing the same key never see each other's responses. The
// scope is hashed into the record's name, never stored in clear. A nil
// function is invalid.
//
// Without WithScope the scope is the principal that the application's
// authentication named with [ContextWithPrincipal] in the request's
// context; a request that names none and carries no Authorization header
// is anonymous (anonymous requests share the empty scope); a request that
// names none and carries an Authorization header is refused, 500
// ErrScopeUnknown, before the store is asked or the handler runs. The
// default refuses to guess: a raw credential is not a principal (a client
// whose token is refreshed between two attempts of one operation would
// land in another scope and run it twice), and a principal read from a
// token that nobody verified would let a forged token read another
// principal's stored response.
//
// [AuthorizationScope] is the scope of credentials that never change
// between retries (static API keys, Basic authentication). Applications
// that authenticate with cookies or client certificates name the
// principal with ContextWithPrincipal, or set WithScope.
func WithScope(fn func(r *http.Request) string) Option {
	return func(c *config) error {
		if fn == nil {
			return invalid("WithScope(nil)")
		}
		c.scope = fn
		return nil
	}
}

// AuthorizationScope is the scope of the request's Authorization header,
// whole (hashed into the store key, never stored in clear); requests
// without one share the empty scope. It was the default before the
// principal ([ContextWithPrincipal]) was: give it to WithScope for
// credentials that never change between the retries of one operation,
// such as static API keys or Basic authentication. A credential that
// changes (an OAuth access token refreshed, per-call credentials) puts a
// retry in another scope, and the handler runs again.
func AuthorizationScope(r *http.Request) string { return r.Header.Get("Authorization") }

// scopeOf returns the scope of r: WithScope's, or by default the
// principal in r's context, else the empty scope for a request without
// credentials; a request with credentials and no principal gets
// ErrScopeUnknown.
func (c *config) scopeOf(r *http.Request) (string, *Error) {
	if c.scope != nil {
		return c.scope(r), nil
	}
	if p, ok := PrincipalFromContext(r.Context()); ok {
		return p, nil
	}
	for _, v := range r.Header.Values("Authorization") {
		if v != "" {
			return "", newError(ErrScopeUnknown, scopeUnknownDetail, 0, nil)
		}
	}
	return "", nil
}

// scopeUnknownDetail is the detail of an ErrScopeUnknown refusal: what to
// do about it.
const scopeUnknownDetail = "idem cannot tell which principal this request acts for: name it with idem.ContextWithPrincipal in your authentication middleware, or choose a scope with idem.WithScope (idem.AuthorizationScope keeps the old behaviour: the header whole)."

// WithFingerprint replaces what identifies "the same request". fn gets the
// request and its complete body and returns the identifying data, which is
// hashed. A retry whose data differs from the first request's gets 422
// (ErrMismatch). The default covers method, path, query, Content-Type and
// body (none with WithKey). A nil function is invalid. grpcidem ignores
// it (it compares the request message; grpcidem.WithoutFingerprint).
func WithFingerprint(fn func(r *http.Request, body []byte) string) Option {
	return func(c *config) error {
		if fn == nil {
			return invalid("WithFingerprint(nil)")
		}
		c.fingerprint, c.noFP, c.fpSet = fn, false, true
		return nil
	}
}

// WithoutFingerprint turns the request comparison off: any request with a
// known key gets the stored response. The body is still read first and
// bounded by WithMaxRequestBody. grpcidem ignores it (its twin:
// grpcidem.WithoutFingerprint).
func WithoutFingerprint() Option {
	return func(c *config) error { c.fingerprint, c.noFP, c.fpSet = nil, true, true; return nil }
}

// WithMaxRequestBody bounds the request body, which is read in full before
// the key is locked so that it can be fingerprinted (and so a slow client
// never holds a key). A larger body gets 413 (ErrBodyTooLarge) without
// being read past the limit. Default 1 MiB; must be positive. grpcidem
// ignores it (gRPC's grpc.MaxRecvMsgSize bounds requests).
func WithMaxRequestBody(n int64) Option {
	return func(c *config) error {
		if n <= 0 {
			return invalid("WithMaxRequestBody(%d): must be positive", n)
		}
		c.maxReq = n
		return nil
	}
}

// WithMaxResponseBody bounds the response body kept for replay. A larger
// response is still sent whole to its client, then recorded as done but
// not replayable: retries get 409 (ErrNotReplayable) and the handler does
// not run again. Default 1 MiB; must be positive. It bounds Do's results
// too; grpcidem ignores it (its twin: grpcidem.WithMaxReply, 4 MiB).
func WithMaxResponseBody(n int) Option {
	return func(c *config) error {
		if n <= 0 {
			return invalid("WithMaxResponseBody(%d): must be positive", n)
		}
		c.maxResp = n
		return nil
	}
}

// WithCacheable decides which final statuses are stored and replayed. For
// the others the key is released so that a retry runs the handler again.
// Default [DefaultCacheable]. A nil function is invalid. grpcidem ignores
// it (its twin: grpcidem.WithStoredCodes).
func WithCacheable(fn func(status int) bool) Option {
	return func(c *config) error {
		if fn == nil {
			return invalid("WithCacheable(nil)")
		}
		c.cacheable = fn
		return nil
	}
}

// DefaultCacheable stores 2xx, 3xx and 4xx responses, except 408 Request
// Timeout, 425 Too Early and 429 Too Many Requests, which ask the client to
// retry. 5xx responses are not stored: the operation may not have happened.
func DefaultCacheable(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 200 && status < 500
}

// WithFailOpen runs the handler unprotected when the store cannot be
// reached, instead of answering 503 (ErrStoreUnavailable). The observer
// gets a FailedOpen event for each such request. A store call that fails
// because the request's own context ended (the client gave up, a deadline
// passed) is not a store failure and never fails open. Only for endpoints
// where a duplicate is cheaper than an outage.
func WithFailOpen() Option {
	return func(c *config) error { c.failOpen = true; return nil }
}

// WithErrorWriter replaces [WriteProblem], the writer of refusals. A nil
// writer is invalid. grpcidem ignores it (its refusals are statuses).
func WithErrorWriter(fn ErrorWriter) Option {
	return func(c *config) error {
		if fn == nil {
			return invalid("WithErrorWriter(nil)")
		}
		c.errorWriter = fn
		return nil
	}
}

// WithObserver calls fn once per protected request, synchronously, when the
// middleware has decided its outcome. The one exception: when the store
// fails to take the result of an execution (Complete, or Release for a
// response that is not stored), the middleware retries in the background
// for up to one lease, and fn is called from there with the final outcome.
// fn must be safe for concurrent use and quick. [Middleware.Shutdown]
// returns after the last of those background calls. Default none; a nil
// function is invalid.
func WithObserver(fn func(Event)) Option {
	return func(c *config) error {
		if fn == nil {
			return invalid("WithObserver(nil)")
		}
		c.observer = fn
		return nil
	}
}

// WithOmitHeaders replaces the list of response headers that are sent to
// the first client but neither stored nor replayed. Default: Set-Cookie,
// since a session cookie minted for one response should not be handed out
// again from the store. Call it with no names to store Set-Cookie too.
// Hop-by-hop headers, Date and Content-Length are never stored, whatever
// this list says. grpcidem ignores it (it keeps all the metadata a
// handler set).
func WithOmitHeaders(names ...string) Option {
	return func(c *config) error {
		c.omit = make(map[string]bool, len(names))
		for _, n := range names {
			c.omit[http.CanonicalHeaderKey(n)] = true
		}
		return nil
	}
}

// WithRebuild sets fn, which answers a retry of a request that completed
// but whose response was not kept, instead of the 409 ErrNotReplayable: the
// response was larger than WithMaxResponseBody, the connection was hijacked
// or failed mid-body, or the process died after the handler committed its
// business transaction with a fence (see storage/pgstore) but before the
// response was stored. fn rebuilds the answer from the application's own
// data (for example the order that the first execution committed, found by
// the idempotency key), writes it to w and returns true; or it writes
// nothing and returns false, and the retry gets the 409. r carries the
// buffered body and, for [FromContext], the Info of the key (Key and
// StorageKey; Protected is false: no lease is held, and fn must not change
// anything). The response carries Idempotent-Replayed: true, is not
// stored (fn runs for each such retry), and the observer gets a Rebuilt
// event. Default none; a nil function is invalid. grpcidem ignores it.
func WithRebuild(fn func(w http.ResponseWriter, r *http.Request) bool) Option {
	return func(c *config) error {
		if fn == nil {
			return invalid("WithRebuild(nil)")
		}
		c.rebuild = fn
		return nil
	}
}
