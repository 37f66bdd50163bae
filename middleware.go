package idem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/httprec"
	"github.com/idemkit/idem/response"
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
	if x.readBody() {
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
	x.run(next)
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

// Shutdown waits until every execution the middleware started has ended:
// each handler has returned and its response is stored (or its key
// released), including the background retries that follow a store failure
// (see [WithLease]). It makes those retries try again at once rather than
// at their next backoff step. It returns nil when nothing is left, or,
// when ctx ends first, an error wrapping ctx's error that says how many
// executions were still unfinished: their keys stay locked until their
// leases expire, and a retry after that runs the handler again.
//
// A deploy that stops the process without it can lose the record of a
// handler that has finished: call it after http.Server.Shutdown has
// returned (so no new request arrives and the handlers have returned), and
// before closing the store:
//
//	srv.Shutdown(ctx) // stop accepting, wait for the handlers
//	m.Shutdown(ctx)   // wait for their records to be stored
//	store.Close()
//
// Requests served after Shutdown began are handled as usual, and Shutdown
// waits for them too. It may be called more than once.
func (m *Middleware) Shutdown(ctx context.Context) error {
	idle := m.work.shutdown()
	select {
	case <-idle: // nothing left wins over an ended ctx
		return nil
	default:
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("idem: shutdown: %d executions not finished: %w", m.work.count(), context.Cause(ctx))
	}
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
	body  []byte
	start time.Time
}

// run takes the lease and executes, or answers from what holds the key.
func (x *exchange) run(next Next) {
	m := x.m
	skey, owner, fp := requestIDs(&m.cfg, x.r, x.route, x.key, x.body)
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

// acquire is the protocol's first step, the same for a request and for
// [Middleware.Do]: it takes the lease on skey for owner, waits while
// another execution holds it (WithWait), and says what comes next:
// Executed (run under the lease), Replayed (answer with res.Record),
// FailedOpen (the store failed: run unprotected, e says why), or any
// other outcome: refuse with e. route is the route (or operation) whose
// handler durations estimate Retry-After; issued says the key must have
// been issued (WithIssuedKeys).
func (m *Middleware) acquire(ctx context.Context, route, skey, owner, fp string, issued bool) (res storage.Result, o Outcome, e *Error) {
	err := ctx.Err() // a context that has ended is refused alike with every store
	if err == nil {
		res, err = m.take(ctx, skey, owner, fp, issued)
		if err == nil && res.State == storage.InFlight && m.cfg.wait > 0 && res.Fingerprint == fp {
			res, err = m.wait(ctx, res, skey, owner, fp, issued)
		}
		if err != nil {
			m.unlock(ctx, skey, owner, err)
		}
	}
	switch {
	case err != nil && ctx.Err() != nil:
		// The caller's own context ended (the client gave up, or a
		// deadline passed): not a store failure, and never a reason to
		// run the handler unprotected.
		return res, Canceled, newError(ErrCanceled, "The request was canceled before it could be processed; retry later.", time.Second, errors.Join(context.Cause(ctx), err))
	case err != nil && m.cfg.failOpen:
		return res, FailedOpen, newError(ErrStoreUnavailable, "The idempotency store is unavailable; retry later.", time.Second, err)
	case err != nil:
		return res, StoreError, newError(ErrStoreUnavailable, "The idempotency store is unavailable; retry later.", time.Second, err)
	case res.State == storage.Acquired:
		return res, Executed, nil
	case res.State == storage.NotIssued:
		return res, Rejected, newError(ErrKeyNotIssued, "This idempotency key was not issued to this client, or it has expired; get a new one.", 0, nil)
	case res.Fingerprint != fp:
		return res, Mismatch, newError(ErrMismatch, "This idempotency key was already used with a different request.", 0, nil)
	case res.State == storage.InFlight:
		return res, Conflict, newError(ErrConflict, "A request with this idempotency key is still being processed; retry later.", m.runs.retryAfter(route, res.LeaseLeft), nil)
	case res.State == storage.Committed:
		return res, Conflict, notReplayable(0)
	}
	return res, Replayed, nil
}

// notReplayable is the answer for a key whose execution completed without
// a response to replay: a record stored as not replayable (status is the
// one it had been sent with, or 0), or a committed entry whose response
// was lost (storage.Committed). A request's retry gets WithRebuild's
// answer instead, when it gives one.
func notReplayable(status int) *Error {
	detail := "The original request completed, but its response was not stored and cannot be replayed."
	if status != 0 {
		detail = fmt.Sprintf("The original request completed with status %d, but its response was not stored and cannot be replayed.", status)
	}
	return newError(ErrNotReplayable, detail, 0, nil)
}

// unlock releases, in the background, the lease an Acquire that failed
// with err may have taken all the same: a call that timed out, or whose
// connection broke, after the store ran it. The owner is this attempt's
// own, so the release can free nothing else; without it the key would
// stay locked for a whole lease. Refusals of the arguments or of room
// created nothing. Shutdown waits for it; it is dropped when the
// background work is at its bound (laterMax).
func (m *Middleware) unlock(ctx context.Context, skey, owner string, err error) {
	if errors.Is(err, storage.ErrInvalid) || errors.Is(err, storage.ErrFull) || !m.pending.take(0) {
		return
	}
	base := context.WithoutCancel(ctx)
	m.work.add()
	go func() {
		defer m.work.done()
		defer m.pending.give(0)
		ctx, cancel := context.WithTimeout(base, m.cfg.lease)
		defer cancel()
		_ = m.store.Release(ctx, skey, owner)
	}()
}

// take is one Acquire, or AcquireIssued for a key that must have been
// issued.
func (m *Middleware) take(ctx context.Context, skey, owner, fp string, issued bool) (storage.Result, error) {
	if issued {
		return m.issuer.AcquireIssued(ctx, skey, owner, fp, m.cfg.lease)
	}
	return m.store.Acquire(ctx, skey, owner, fp, m.cfg.lease)
}

// wait polls the store until the execution in flight finishes or the wait
// ends, starting from the InFlight result res. It returns the last Acquire
// result, or ctx's error when ctx ends first.
func (m *Middleware) wait(ctx context.Context, res storage.Result, skey, owner, fp string, issued bool) (storage.Result, error) {
	deadline := time.Now().Add(m.cfg.wait)
	delay := 5 * time.Millisecond
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for res.State == storage.InFlight {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		t.Reset(min(delay, left, res.LeaseLeft))
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, 200*time.Millisecond)
		var err error
		if res, err = m.take(ctx, skey, owner, fp, issued); err != nil {
			return res, err
		}
	}
	return res, nil
}

// handlerState is what a request the handler runs needs on the heap, in
// one allocation: the context that carries its Info, its body, the context
// of the store call that ends it, and its place in the heartbeat queue. It
// is never reused: a handler may keep its request's context.
type handlerState struct {
	ctx  infoCtx
	body bodyReader
	fin  finishCtx
	beat beat
}

// execute runs the handler under the lease, then ends the execution
// (finish.go) however the handler ended.
func (x *exchange) execute(next Next, skey, owner string) {
	m := x.m
	m.work.add()
	defer m.work.done()
	f := finish{m: m, ctx: x.r.Context(), method: x.r.Method, route: x.eventRoute(), start: x.start, skey: skey, owner: owner}
	st := new(handlerState)
	cw := capturePool.Get().(*httprec.Capture)
	cw.Reset(x.w, m.cfg.maxResp, m.omit)
	r := handlerRequest(x.r, x.body, st, Info{Key: x.key, Owner: owner, Protected: true, StorageKey: skey}, m.cfg.ttl)
	m.beats.start(&st.beat, x.r.Context(), skey, owner)
	returned := false
	defer func() {
		if returned {
			return
		}
		// The handler panicked, or called runtime.Goexit (recover then
		// returns nil and the goroutine goes on unwinding; panic(nil) is
		// a *runtime.PanicNilError since Go 1.21).
		p := recover()
		f.end(st, cw, &PanicError{Value: p, Goexit: p == nil})
		if p != nil {
			panic(p)
		}
	}()
	began := time.Now()
	next(cw, r)
	returned = true
	m.runs.observe(x.route, time.Since(began))
	f.end(st, cw, nil)
	cw.Reset(nil, 0, nil)
	capturePool.Put(cw)
}

// capturePool holds the Captures of finished executions: their header
// snapshot and body buffer are reused.
var capturePool = sync.Pool{New: func() any { return new(httprec.Capture) }}

// replay answers with a stored record.
func (x *exchange) replay(data []byte, skey string) {
	status, err := httprec.ReplayBinary(x.w, data)
	switch {
	case status == 0 && errors.Is(err, httprec.ErrCorrupt):
		x.refuse(StoreError, newError(ErrCorruptRecord, "The stored response for this idempotency key cannot be read.", 0, err))
	case err == httprec.ErrNotReplayable:
		x.notReplayable(notReplayable(status), skey)
	default:
		// err is the writer's, when the client went away mid-replay.
		x.emit(Replayed, status, err)
	}
}

// notReplayable answers a retry whose first execution completed without a
// response to replay: with WithRebuild's answer, if it gives one, or else
// with e, an ErrNotReplayable.
func (x *exchange) notReplayable(e *Error, skey string) {
	if !x.rebuild(skey) {
		x.refuse(Conflict, e)
	}
}

// rebuild answers a retry whose first execution completed without a kept
// response through WithRebuild's function, if there is one and it answers.
func (x *exchange) rebuild(skey string) bool {
	m := x.m
	if m.cfg.rebuild == nil {
		return false
	}
	h := x.w.Header()
	h.Set(response.ReplayedHeader, "true")
	cw := httprec.NewCapture(x.w, 0, nil) // for the status only
	r := handlerRequest(x.r, x.body, new(handlerState), Info{Key: x.key, StorageKey: skey}, 0)
	if !m.cfg.rebuild(cw, r) {
		h.Del(response.ReplayedHeader)
		return false
	}
	cw.Finish()
	x.emit(Rebuilt, cw.Status(), nil)
	return true
}

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
