package idem

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/httprec"
	"github.com/idemkit/idem/storage"
)

// Middleware makes handlers idempotent. It is framework-neutral: the
// adapters nethttp, ginidem and echoidem translate their framework's
// request and writer to [Middleware.Serve]. A Middleware is safe for
// concurrent use and may be shared by many routes and adapters.
type Middleware struct {
	store storage.Store
	// issuer is store when the middleware accepts issued keys only
	// (WithIssuedKeys).
	issuer  storage.Issuer
	issued  *issueLimit // with issuer
	cfg     config
	omit    func(name string) bool
	beats   beats
	work    work
	pending pending
	runs    runTimes
}

// New returns a Middleware that keeps its records in store. Without
// options it protects POST and PATCH requests that carry an
// Idempotency-Key header, keeps responses for 24 hours, and holds a 30
// second lease while a handler runs (see the With options for every
// default). It returns an error wrapping ErrInvalidOption when store is
// nil or an option has an invalid value.
func New(store storage.Store, opts ...Option) (*Middleware, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidOption)
	}
	m := &Middleware{store: store, cfg: defaultConfig(), pending: pending{max: laterMax, maxBytes: laterMaxBytes}}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&m.cfg); err != nil {
			return nil, err
		}
	}
	if m.cfg.ttl < m.cfg.lease {
		return nil, invalid("WithTTL(%v) is shorter than the lease (%v)", m.cfg.ttl, m.cfg.lease)
	}
	if m.cfg.issuedTTL > 0 {
		var ok bool
		if m.issuer, ok = store.(storage.Issuer); !ok {
			return nil, invalid("WithIssuedKeys: the store (%T) does not implement storage.Issuer", store)
		}
		m.issued = newIssueLimit(m.cfg.issueLimit)
	}
	omit := m.cfg.omit
	m.omit = func(name string) bool { return omit[name] }
	m.beats.init(m)
	return m, nil
}

// Next is the rest of the chain, as [Middleware.Serve] calls it. w is the
// writer the handlers must write through: the writer given to Serve when
// the request is not protected, and when it is, the middleware's own,
// which sends the response to the client as it records it (it unwraps to
// the writer given to Serve). An adapter whose framework keeps a writer of
// its own routes the handlers' writes through w when w is not the writer
// it gave Serve (see package response).
type Next func(w http.ResponseWriter, r *http.Request)

// Serve runs one request through the idempotency protocol; it is the step
// an adapter calls. route is the framework's route pattern, or "" when no
// route matched, in which case the request passes through untouched.
//
// Serve calls next at most once:
//   - with w and r unchanged, for a request it does not protect (method
//     not protected, no route, no key);
//   - with the middleware's writer, which wraps w and records the
//     response, and a request carrying the buffered body, the [Info] for
//     FromContext and the storage.Lease, when this request holds the
//     lease;
//   - with w and a request carrying the body, unprotected, when the store
//     failed and WithFailOpen is set.
//
// When Serve does not call next it has written the response itself: a
// replay or a refusal. A panic in next releases the key and is re-raised.
func (m *Middleware) Serve(w http.ResponseWriter, r *http.Request, route string, next Next) {
	if route == "" || !m.protects(r.Method) {
		next(w, r)
		return
	}
	if m.cfg.keySource != nil {
		m.serveSourced(w, r, route, next)
		return
	}
	key, present, err := headerKey(r.Header, m.cfg.header)
	if !present && !m.cfg.requireKey {
		next(w, r)
		return
	}
	x := exchange{m: m, w: w, r: r, route: route}
	if m.cfg.observer != nil {
		x.start = time.Now()
	}
	switch {
	case !present:
		x.refuse(Rejected, newError(ErrMissingKey, "This endpoint requires an "+m.cfg.header+" header.", 0, nil))
		return
	case err != nil:
		x.refuse(Rejected, newError(ErrInvalidKey, "The "+m.cfg.header+" header is invalid: "+err.Error()+".", 0, nil))
		return
	}
	x.key = key
	if x.resolveScope() && x.readBody() {
		x.run(next)
	}
}

// serveSourced serves a request whose key comes from the KeySource
// (WithKey): the body first, then the key.
func (m *Middleware) serveSourced(w http.ResponseWriter, r *http.Request, route string, next Next) {
	x := exchange{m: m, w: w, r: r, route: route}
	if m.cfg.observer != nil {
		x.start = time.Now()
	}
	if !x.readBody() {
		return
	}
	key, kerr := sourceKey(m.cfg.keySource, r, x.body)
	if kerr != nil {
		x.refuse(Rejected, kerr)
		return
	}
	x.key = key
	if x.resolveScope() {
		x.run(next)
	}
}

// readBody reads the request's body into x.body, or refuses the request
// and reports false.
func (x *exchange) readBody() bool {
	body, kerr := readBody(x.w, x.r, x.m.cfg.maxReq)
	if kerr != nil {
		if errors.Is(kerr, ErrBodyTooLarge) {
			x.w.Header().Set("Connection", "close")
		}
		x.refuse(Rejected, kerr)
		return false
	}
	x.body = body
	return true
}

// protects reports whether requests with this method are protected.
func (m *Middleware) protects(method string) bool {
	for _, p := range m.cfg.methods {
		if p == method {
			return true
		}
	}
	return false
}

// exchange is the state of one protected request.
type exchange struct {
	m     *Middleware
	w     http.ResponseWriter
	r     *http.Request
	route string
	key   string
	scope string
	body  []byte
	start time.Time
}

// resolveScope sets x.scope, or refuses the request and reports false.
func (x *exchange) resolveScope() bool {
	scope, e := x.m.cfg.scopeOf(x.r)
	if e != nil {
		x.refuse(Rejected, e)
		return false
	}
	x.scope = scope
	return true
}

// run takes the lease and executes, or answers from what holds the key.
func (x *exchange) run(next Next) {
	m := x.m
	skey, owner, fp := requestIDs(&m.cfg, x.r, x.scope, x.route, x.key, x.body)
	res, o, e := m.acquire(x.r.Context(), x.route, skey, owner, fp, m.issuer != nil)
	switch o {
	case Executed:
		x.execute(next, skey, owner)
	case Replayed:
		x.replay(res.Record, skey)
	case FailedOpen:
		x.emit(FailedOpen, 0, e)
		next(x.w, handlerRequest(x.r, x.body, new(handlerState), Info{Key: x.key}, 0))
	case Conflict:
		if e.Kind == ErrNotReplayable {
			x.notReplayable(e, skey)
			break
		}
		x.refuse(o, e)
	default:
		x.refuse(o, e)
	}
}

// execute runs the handler under the lease (execution.go).
func (x *exchange) execute(next Next, skey, owner string) {
	m := x.m
	e := &execution{finish: finish{m: m, caller: x.r.Context(), method: x.r.Method,
		route: x.eventRoute(), start: x.start, skey: skey, owner: owner}}
	e.cw = capturePool.Get().(*httprec.Capture)
	e.cw.Reset(x.w, m.cfg.maxResp, m.omit)
	e.r = handlerRequest(x.r, x.body, &e.handlerState, Info{Key: x.key, Owner: owner, Protected: true, StorageKey: skey}, m.cfg.ttl)
	e.run(x.route, next, nil)
	e.cw.Reset(nil, 0, nil) // not after a panic, which goes on
	capturePool.Put(e.cw)
}

// capturePool holds the Captures of finished executions: their header
// snapshot and body buffer are reused.
var capturePool = sync.Pool{New: func() any { return new(httprec.Capture) }}

// refuse writes e to the client and tells the observer.
func (x *exchange) refuse(o Outcome, e *Error) {
	x.m.cfg.errorWriter(x.w, x.r, e)
	x.emit(o, e.Status, e)
}

func (x *exchange) emit(o Outcome, status int, err error) {
	if x.m.cfg.observer != nil {
		x.m.emit(Event{Outcome: o, Method: x.r.Method, Route: x.eventRoute(), Status: status,
			Duration: time.Since(x.start), Err: err, Context: x.r.Context()})
	}
}

// emit tells the observer, if there is one, of ev.
func (m *Middleware) emit(ev Event) {
	if m.cfg.observer != nil {
		m.cfg.observer(ev)
	}
}

// eventRoute is the route as events report it: the route pattern without
// the method that net/http patterns start with ("POST /orders" becomes
// "/orders"), so that every adapter reports the same route.
func (x *exchange) eventRoute() string {
	if rest, ok := strings.CutPrefix(x.route, x.r.Method); ok && rest != "" && (rest[0] == ' ' || rest[0] == '\t') {
		return strings.TrimLeft(rest, " \t")
	}
	return x.route
}
