package idem

import (
	"bytes"
	"context"
	"crypto/rand"
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
	// keeper is store when it can keep the records it is given.
	keeper storage.RecordKeeper
	cfg    config
	omit   func(name string) bool
	beats  beats
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
	m.keeper, _ = store.(storage.RecordKeeper)
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
	m.beats.init(m)
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

// appendFingerprint appends what identifies the request: by default a
// hash of the method, path, query, Content-Type and body; fingerprintLen
// bytes, or none WithoutFingerprint.
func (m *Middleware) appendFingerprint(b []byte, h *hasher, r *http.Request, body []byte) []byte {
	if m.cfg.noFP {
		return b
	}
	if m.cfg.fingerprint != nil {
		h.buf = appendFields(h.buf[:0], "custom", m.cfg.fingerprint(r, body))
		return append(b, h.sum128(nil)...)
	}
	h.buf = appendFields(h.buf[:0], "default", r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("Content-Type"))
	return append(b, h.sum128(body)...)
}

// appendOwner appends a random lease owner token: ownerLen hex digits.
func appendOwner(b []byte) []byte {
	p := randPool.Get().(*randBytes)
	if p.off+ownerLen/2 > len(p.b) {
		rand.Read(p.b[:])
		p.off = 0
	}
	b = hex.AppendEncode(b, p.b[p.off:p.off+ownerLen/2])
	clear(p.b[p.off : p.off+ownerLen/2]) // handed out once only
	p.off += ownerLen / 2
	randPool.Put(p)
	return b
}

// randBytes is a batch of bytes from crypto/rand, used from off on: one
// call of rand.Read for 64 owner tokens costs less than one per token. A
// batch belongs to one goroutine at a time (through randPool), so no two
// tokens share bytes.
type randBytes struct {
	b   [64 * ownerLen / 2]byte
	off int
}

var randPool = sync.Pool{New: func() any { return &randBytes{off: len(randBytes{}.b)} }}

// ids returns the storage key, a new owner token and the fingerprint of
// the request, all three in one allocation.
func (x *exchange) ids() (skey, owner, fp string) {
	m := x.m
	h := getHasher()
	var a [storageKeyLen + ownerLen + fingerprintLen]byte
	b := h.appendStorageKey(a[:0], m.cfg.scope(x.r), x.r.Method, x.route, x.key)
	b = appendOwner(b)
	b = m.appendFingerprint(b, h, x.r, x.body)
	putHasher(h)
	all := string(b)
	return all[:storageKeyLen], all[storageKeyLen : storageKeyLen+ownerLen], all[storageKeyLen+ownerLen:]
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
	skey, owner, fp := x.ids()
	ctx := x.r.Context()

	res, err := m.store.Acquire(ctx, skey, owner, fp, m.cfg.lease)
	if err == nil && res.State == storage.InFlight && m.cfg.wait > 0 && res.Fingerprint == fp {
		res, err = x.wait(ctx, res, skey, owner, fp)
	}
	if err != nil {
		if m.cfg.failOpen {
			x.emit(FailedOpen, 0, fmt.Errorf("%w: %w", ErrStoreUnavailable, err))
			next(x.w, x.request(new(handlerState), Info{Key: x.key}))
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

// request returns the request the handler sees: the buffered body and the
// Info in its context, both held in st.
func (x *exchange) request(st *handlerState, info Info) *http.Request {
	st.ctx = infoCtx{Context: x.r.Context(), info: info}
	r := x.r.WithContext(&st.ctx)
	if x.body != nil {
		st.body.Reset(x.body)
		r.Body = &st.body
		r.ContentLength = int64(len(x.body))
	}
	return r
}

type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// execute runs the handler under the lease, then stores or releases.
func (x *exchange) execute(next func(http.ResponseWriter, *http.Request), skey, owner string) {
	m := x.m
	st := new(handlerState)
	cw := capturePool.Get().(*response.Capture)
	cw.Reset(x.w, m.cfg.maxResp, m.omit)
	r := x.request(st, Info{Key: x.key, Owner: owner, Protected: true})
	hb := &st.beat
	m.beats.start(hb, skey, owner)
	finished := false
	defer func() {
		if finished {
			return
		}
		// The handler panicked, or called runtime.Goexit (recover then
		// returns nil and the goroutine goes on unwinding). Either way it
		// did not complete: release the key so a retry runs again.
		p := recover()
		m.beats.stop(hb)
		st.fin.start(x.r.Context(), m.cfg.lease)
		err := m.store.Release(&st.fin, skey, owner)
		st.fin.stop()
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
	m.beats.stop(hb)
	cw.Finish()
	st.fin.start(x.r.Context(), m.cfg.lease)
	x.finish(&st.fin, cw, skey, owner)
	st.fin.stop()
	cw.Reset(nil, 0, nil)
	capturePool.Put(cw)
}

// capturePool holds the Captures of finished executions: their header
// snapshot and body buffer are reused.
var capturePool = sync.Pool{New: func() any { return new(response.Capture) }}

// finish stores the captured response, or releases the key.
// ctx is the finish context, which the client's disconnect does not
// cancel and the lease bounds.
func (x *exchange) finish(ctx context.Context, cw *response.Capture, skey, owner string) {
	m := x.m
	rec, ok := cw.Record()
	status := cw.Status()
	var outcome Outcome
	var err error
	switch {
	case !cw.Hijacked() && !m.cfg.cacheable(status):
		outcome = Released
		if err = m.store.Release(ctx, skey, owner); retryable(err) {
			x.finishLater(outcome, status, err, func(ctx context.Context) error { return m.store.Release(ctx, skey, owner) })
			return
		}
	default:
		outcome = Executed
		if !ok {
			outcome = NotReplayable
			rec = response.Record{Status: rec.Status, NotReplayable: true}
		}
		b, buf, encErr := m.encode(&rec)
		if encErr != nil {
			err = encErr
			break
		}
		err = m.complete(ctx, skey, owner, b)
		retrying := retryable(err)
		if retrying {
			kept := b // after an error b is still ours; a pooled one goes back below
			if buf != nil {
				kept = bytes.Clone(b)
			}
			x.finishLater(outcome, status, err, func(ctx context.Context) error { return m.complete(ctx, skey, owner, kept) })
		}
		if buf != nil {
			*buf = b
			putBuf(buf)
		}
		if retrying {
			return
		}
	}
	outcome, err = finishOutcome(outcome, err)
	x.emit(outcome, status, err)
}

// encode encodes rec: for a store that keeps records, into a buffer of its
// own that complete hands over; otherwise into a pooled buffer, returned as
// buf for the caller to put back.
func (m *Middleware) encode(rec *response.Record) (b []byte, buf *[]byte, err error) {
	if m.keeper != nil {
		b, err = rec.MarshalBinary()
		return b, nil, err
	}
	buf = getBuf()
	if b, err = rec.AppendBinary((*buf)[:0]); err != nil {
		putBuf(buf)
		return nil, nil, err
	}
	return b, buf, nil
}

// complete stores record b for skey, handing b over to a store that keeps
// records, which the caller then never touches again.
func (m *Middleware) complete(ctx context.Context, skey, owner string, b []byte) error {
	if m.keeper != nil {
		return m.keeper.CompleteKeep(ctx, skey, owner, b, m.cfg.ttl)
	}
	return m.store.Complete(ctx, skey, owner, b, m.cfg.ttl)
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
	status, err := response.ReplayBinary(x.w, data)
	switch {
	case status == 0 && errors.Is(err, response.ErrCorrupt):
		x.refuse(StoreError, newError(ErrCorruptRecord, "The stored response for this idempotency key cannot be read.", 0, err))
	case err == response.ErrNotReplayable:
		detail := "The original request completed, but its response was not stored and cannot be replayed."
		if status != 0 {
			detail = fmt.Sprintf("The original request completed with status %d, but its response was not stored and cannot be replayed.", status)
		}
		x.refuse(Conflict, newError(ErrNotReplayable, detail, 0, nil))
	default:
		x.emit(Replayed, status, nil)
	}
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

// beats renews the leases of the handlers that run for longer than
// lease/3, every lease/3, with one timer for the whole Middleware: a
// handler that finishes sooner costs no timer, goroutine or allocation.
// The queue is in order of due time, since every entry is due the same
// period after it was queued.
type beats struct {
	m     *Middleware
	every time.Duration

	mu         sync.Mutex
	t          *time.Timer // armed while armed is true
	armed      bool
	head, tail *beat // waiting, soonest due first
}

// beat is one handler's place in the heartbeat queue.
type beat struct {
	skey, owner string
	due         time.Time
	prev, next  *beat
	queued      bool
	stopped     bool
	renewing    sync.WaitGroup // a renewal in progress
}

func (s *beats) init(m *Middleware) {
	s.m, s.every = m, m.cfg.lease/3
	s.t = time.AfterFunc(time.Hour, s.fire)
	s.t.Stop()
}

// start queues b: its lease is renewed every lease/3 until stop.
func (s *beats) start(b *beat, skey, owner string) {
	b.skey, b.owner = skey, owner
	s.mu.Lock()
	s.push(b)
	s.mu.Unlock()
}

// stop ends b's renewals and waits for one in progress, so that no renewal
// happens after the handler finished.
func (s *beats) stop(b *beat) {
	s.mu.Lock()
	b.stopped = true
	if b.queued {
		s.unlink(b)
	}
	s.mu.Unlock()
	b.renewing.Wait()
}

// push queues b, due one period from now. s.mu is held.
func (s *beats) push(b *beat) {
	b.due = time.Now().Add(s.every)
	b.prev, b.next, b.queued = s.tail, nil, true
	if s.tail != nil {
		s.tail.next = b
	} else {
		s.head = b
	}
	s.tail = b
	if !s.armed {
		s.armed = true
		s.t.Reset(s.every)
	}
}

// unlink takes b out of the queue. s.mu is held.
func (s *beats) unlink(b *beat) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		s.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		s.tail = b.prev
	}
	b.prev, b.next, b.queued = nil, nil, false
}

// fire starts the renewals that are due and arms the timer for the next.
func (s *beats) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for b := s.head; b != nil && !b.due.After(now); b = s.head {
		s.unlink(b)
		b.renewing.Add(1)
		go s.renew(b)
	}
	if s.head == nil {
		s.armed = false
		return
	}
	s.t.Reset(s.head.due.Sub(now))
}

// renew extends b's lease once and queues it again, unless the handler
// finished meanwhile or the lease was lost (the finish will see it and
// tell the observer).
func (s *beats) renew(b *beat) {
	defer b.renewing.Done()
	ctx, cancel := context.WithTimeout(context.Background(), s.every)
	err := s.m.store.Extend(ctx, b.skey, b.owner, s.m.cfg.lease)
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !b.stopped && !errors.Is(err, storage.ErrNotOwner) {
		s.push(b)
	}
}
