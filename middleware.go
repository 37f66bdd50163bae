package idem

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/idemkit/idem/response"
	"github.com/idemkit/idem/storage"
)

// Middleware makes handlers idempotent. It is framework-neutral: the
// adapters nethttp, ginidem and echoidem translate their framework's
// request and writer to [Middleware.Serve]. A Middleware is safe for
// concurrent use and may be shared by many routes and adapters.
type Middleware struct {
	store storage.Store
	cfg   config
	omit  func(name string) bool
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
	m := &Middleware{store: store, cfg: defaultConfig()}
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
	omit := m.cfg.omit
	m.omit = func(name string) bool { return omit[name] }
	return m, nil
}

// Serve runs one request through the idempotency protocol; it is the step
// an adapter calls. route is the framework's route pattern, or "" when no
// route matched, in which case the request passes through untouched.
//
// Serve calls next at most once:
//   - with w and r unchanged, for a request it does not protect (method not
//     protected, no route, no key);
//   - with a *response.Capture wrapping w and a request carrying the
//     buffered body and the [Info] for FromContext, when this request holds
//     the lease; the adapter must route every write through that writer;
//   - with w and a request carrying the body, unprotected, when the store
//     failed and WithFailOpen is set.
//
// When Serve does not call next it has written the response itself: a
// replay or a refusal. A panic in next releases the key and is re-raised.
func (m *Middleware) Serve(w http.ResponseWriter, r *http.Request, route string, next func(http.ResponseWriter, *http.Request)) {
	if route == "" || !m.protects(r.Method) {
		next(w, r)
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
	body, kerr := m.readBody(w, r)
	if kerr != nil {
		if errors.Is(kerr, ErrBodyTooLarge) {
			w.Header().Set("Connection", "close")
		}
		x.refuse(Rejected, kerr)
		return
	}
	x.body = body
	x.run(next)
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

// readBody reads the whole request body, refusing one over the limit
// without reading past it.
func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *Error) {
	max := m.cfg.maxReq
	if r.ContentLength > max {
		return nil, newError(ErrBodyTooLarge, fmt.Sprintf("The request body is larger than %d bytes.", max), 0, nil)
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	var buf []byte
	if r.ContentLength >= 0 {
		buf = make([]byte, 0, r.ContentLength+1)
	} else {
		buf = make([]byte, 0, 512)
	}
	// MaxBytesReader needs the server's own writer to close the connection.
	rd := http.MaxBytesReader(response.Innermost(w), r.Body, max)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				return nil, newError(ErrBodyTooLarge, fmt.Sprintf("The request body is larger than %d bytes.", max), 0, nil)
			}
			return nil, newError(ErrBodyRead, "The request body could not be read.", 0, err)
		}
	}
}

// fingerprint identifies the request: by default a hash of the method,
// path, query, Content-Type and body; 16 bytes.
func (m *Middleware) fingerprint(r *http.Request, body []byte) string {
	if m.cfg.noFP {
		return ""
	}
	h := sha256.New()
	if m.cfg.fingerprint != nil {
		hashFields(h, "custom", m.cfg.fingerprint(r, body))
	} else {
		hashFields(h, "default", r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("Content-Type"))
		h.Write(body)
	}
	var sum [sha256.Size]byte
	return string(h.Sum(sum[:0])[:16])
}

// newOwner returns a random lease owner token: 32 hex digits.
func newOwner() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
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

func (x *exchange) run(next func(http.ResponseWriter, *http.Request)) {
	m := x.m
	fp := m.fingerprint(x.r, x.body)
	skey := storageKey(m.cfg.scope(x.r), x.r.Method, x.route, x.key)
	owner := newOwner()
	ctx := x.r.Context()

	res, err := m.store.Acquire(ctx, skey, owner, fp, m.cfg.lease)
	if err == nil && res.State == storage.InFlight && m.cfg.wait > 0 && res.Fingerprint == fp {
		res, err = x.wait(ctx, res, skey, owner, fp)
	}
	if err != nil {
		if m.cfg.failOpen {
			x.emit(FailedOpen, 0, fmt.Errorf("%w: %w", ErrStoreUnavailable, err))
			next(x.w, x.request(Info{Key: x.key}))
			return
		}
		x.refuse(StoreError, newError(ErrStoreUnavailable, "The idempotency store is unavailable; retry later.", time.Second, err))
		return
	}
	switch {
	case res.State == storage.Acquired:
		x.execute(next, skey, owner)
	case res.Fingerprint != fp:
		x.refuse(Mismatch, newError(ErrMismatch, "This idempotency key was already used with a different request.", 0, nil))
	case res.State == storage.InFlight:
		x.refuse(Conflict, newError(ErrConflict, "A request with this idempotency key is still being processed; retry later.", res.LeaseLeft, nil))
	default:
		x.replay(res.Record)
	}
}

// wait polls the store until the request in flight finishes or the wait
// ends, starting from the InFlight result res. It returns the last Acquire
// result.
func (x *exchange) wait(ctx context.Context, res storage.Result, skey, owner, fp string) (storage.Result, error) {
	m := x.m
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
		if res, err = m.store.Acquire(ctx, skey, owner, fp, m.cfg.lease); err != nil {
			return res, err
		}
	}
	return res, nil
}

// request returns the request the handler sees: the buffered body and the
// Info in its context.
func (x *exchange) request(info Info) *http.Request {
	r := x.r.WithContext(&infoCtx{Context: x.r.Context(), info: info})
	if x.body != nil {
		r.Body = &bodyReader{Reader: bytes.NewReader(x.body)}
		r.ContentLength = int64(len(x.body))
	}
	return r
}

type bodyReader struct{ *bytes.Reader }

func (*bodyReader) Close() error { return nil }

// execute runs the handler under the lease, then stores or releases.
func (x *exchange) execute(next func(http.ResponseWriter, *http.Request), skey, owner string) {
	m := x.m
	cw := response.NewCapture(x.w, m.cfg.maxResp, m.omit)
	r := x.request(Info{Key: x.key, Owner: owner, Protected: true})
	hb := m.heartbeat(skey, owner)
	finished := false
	defer func() {
		if finished {
			return
		}
		// The handler panicked, or called runtime.Goexit (recover then
		// returns nil and the goroutine goes on unwinding). Either way it
		// did not complete: release the key so a retry runs again.
		p := recover()
		hb.stop()
		err := m.finishCtx(x.r, func(ctx context.Context) error { return m.store.Release(ctx, skey, owner) })
		if err == nil && p != nil {
			err = fmt.Errorf("idem: handler panicked: %v", p)
		} else if err == nil {
			err = errors.New("idem: handler exited with runtime.Goexit")
		}
		x.emit(Released, cw.Status(), err)
		if p != nil {
			panic(p)
		}
	}()
	next(cw, r)
	finished = true
	hb.stop()
	cw.Finish()
	x.finish(cw, skey, owner)
}

// finish stores the captured response, or releases the key.
func (x *exchange) finish(cw *response.Capture, skey, owner string) {
	m := x.m
	rec, ok := cw.Record()
	status := cw.Status()
	var outcome Outcome
	var err error
	switch {
	case !cw.Hijacked() && !m.cfg.cacheable(status):
		outcome = Released
		err = m.finishCtx(x.r, func(ctx context.Context) error { return m.store.Release(ctx, skey, owner) })
	default:
		outcome = Executed
		if !ok {
			outcome = NotReplayable
			rec = response.Record{Status: rec.Status, NotReplayable: true}
		}
		buf := getBuf()
		b, encErr := rec.AppendBinary((*buf)[:0])
		if encErr != nil {
			err = encErr
		} else {
			err = m.finishCtx(x.r, func(ctx context.Context) error { return m.store.Complete(ctx, skey, owner, b, m.cfg.ttl) })
		}
		*buf = b
		putBuf(buf)
	}
	switch {
	case errors.Is(err, storage.ErrNotOwner):
		outcome, err = LeaseLost, fmt.Errorf("%w: %w", ErrLeaseLost, err)
	case err != nil:
		outcome = StoreError
	}
	x.emit(outcome, status, err)
}

// finishCtx runs a store call on a context that the client's disconnect
// does not cancel, bounded by the lease.
func (m *Middleware) finishCtx(r *http.Request, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), m.cfg.lease)
	defer cancel()
	return f(ctx)
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) <= 64<<10 {
		bufPool.Put(b)
	}
}

// replay answers with a stored record.
func (x *exchange) replay(data []byte) {
	var rec response.Record
	if err := rec.UnmarshalBinary(data); err != nil {
		x.refuse(StoreError, newError(ErrCorruptRecord, "The stored response for this idempotency key cannot be read.", 0, err))
		return
	}
	if rec.NotReplayable {
		detail := "The original request completed, but its response was not stored and cannot be replayed."
		if rec.Status != 0 {
			detail = fmt.Sprintf("The original request completed with status %d, but its response was not stored and cannot be replayed.", rec.Status)
		}
		x.refuse(Conflict, newError(ErrNotReplayable, detail, 0, nil))
		return
	}
	response.Replay(x.w, &rec)
	x.emit(Replayed, rec.Status, nil)
}

// refuse writes e to the client and tells the observer.
func (x *exchange) refuse(o Outcome, e *Error) {
	x.m.cfg.errorWriter(x.w, x.r, e)
	x.emit(o, e.Status, e)
}

func (x *exchange) emit(o Outcome, status int, err error) {
	obs := x.m.cfg.observer
	if obs == nil {
		return
	}
	obs(Event{Outcome: o, Method: x.r.Method, Route: x.route, Status: status, Duration: time.Since(x.start), Err: err})
}

// beat renews a lease every lease/3 while its handler runs.
type beat struct {
	mu      sync.Mutex
	t       *time.Timer
	stopped bool
}

func (m *Middleware) heartbeat(skey, owner string) *beat {
	b := &beat{}
	every := m.cfg.lease / 3
	b.mu.Lock()
	defer b.mu.Unlock()
	b.t = time.AfterFunc(every, func() {
		// Holding mu through Extend makes stop wait for a renewal in
		// progress, so no renewal happens after the handler finished.
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.stopped {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		err := m.store.Extend(ctx, skey, owner, m.cfg.lease)
		cancel()
		if errors.Is(err, storage.ErrNotOwner) {
			return // lost: the finish will see it and tell the observer
		}
		b.t.Reset(every)
	})
	return b
}

func (b *beat) stop() {
	b.mu.Lock()
	b.stopped = true
	b.t.Stop()
	b.mu.Unlock()
}
