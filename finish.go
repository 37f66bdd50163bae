package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/httprec"
	"github.com/idemkit/idem/storage"
)

// This file is how an execution ends, whatever its handler did: it
// returned, panicked or called runtime.Goexit. One path decides what the
// store must do (keep the response, or release the key), does it on a
// context the client's disconnect does not cancel, retries it in the
// background when the store fails, and tells the observer what really
// happened.

// PanicError is the [Event.Err] of an execution whose handler panicked or
// called runtime.Goexit. The key was released, so a retry runs the handler
// again; the panic itself goes on to the recovery middleware outside idem.
type PanicError struct {
	// Value is what the handler panicked with; nil after runtime.Goexit.
	Value any
	// Goexit is true when the handler called runtime.Goexit (as
	// testing's t.FailNow does) instead of panicking.
	Goexit bool
}

// Error describes the panic with its value.
func (e *PanicError) Error() string {
	if e.Goexit {
		return "idem: handler exited with runtime.Goexit"
	}
	return fmt.Sprintf("idem: handler panicked: %v", e.Value)
}

// Unwrap returns the panic value when it is an error, for errors.Is and
// errors.As.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// finish ends one execution, of a request or of [Middleware.Do]. It holds
// what the store calls after the handler and the event need, so that a
// background retry keeps no reference to the request's exchange, whose
// buffers are reused.
type finish struct {
	m           *Middleware
	caller      context.Context // the request's, or Do's
	method      string          // the request's; "" for Do
	route       string          // as events report it
	start       time.Time       // of the middleware, for Event.Duration
	skey, owner string
	handler     time.Duration // how long the handler ran, for Event.Handler
	retries     int           // background attempts made, for Event.Retries
}

// release releases the key of an execution that ended with outcome
// (Released or Canceled) for cause (nil after a normal return), the
// lease's renewals stopped; status is the one sent, for the event.
func (e *execution) release(outcome Outcome, status int, cause error) {
	f, m := &e.finish, e.m
	e.fin.start(f.caller, m.cfg.lease)
	err := m.store.Release(&e.fin, f.skey, f.owner)
	e.fin.stop()
	if retryable(err) {
		// The closure takes copies: capturing f would move it to the heap
		// for every execution, not only for those that retry.
		skey, owner := f.skey, f.owner
		f.later(outcome, status, cause, err, 0, func(ctx context.Context) error { return m.store.Release(ctx, skey, owner) })
		return
	}
	outcome, err = settled(outcome, cause, err)
	f.emit(f.caller, outcome, status, err)
}

// keep stores rec, the result of an execution whose lease's renewals have
// stopped: replayable when whole, or else as done but not replayable.
// status is the one sent, for the event; sent says whether any of the
// response went out (always, for Do's result); cause is the handler's
// panic, if any, for the event.
//
// A record that cannot be encoded (a status outside 100..999, which no
// adapter records) is kept as done but not replayable when something was
// sent, and released when nothing was.
func (e *execution) keep(rec *httprec.Record, whole bool, status int, sent bool, cause error) {
	f := &e.finish
	outcome := Executed
	if !whole {
		outcome = NotReplayable
		*rec = httprec.Record{Status: rec.Status, NotReplayable: true}
	}
	b, buf, err := f.encode(rec)
	if err != nil {
		if !sent {
			e.release(Released, status, errors.Join(cause, err))
			return
		}
		outcome = NotReplayable
		*rec = httprec.Record{NotReplayable: true} // status 0: always encodes
		b, buf, err = f.encode(rec)
	}
	if err == nil {
		e.fin.start(f.caller, f.m.cfg.lease)
		err = f.keepRecord(&e.fin, b, rec.Status)
		e.fin.stop()
		retrying := retryable(err)
		if retrying {
			// The closure captures only what is declared here: a variable
			// of the enclosing block would move to the heap for every
			// execution, not only for those that retry.
			kept := bytes.Clone(b) // b's pooled buffer goes back below
			fc := *f               // a copy, for the reason given in end
			recStatus := rec.Status
			f.later(outcome, status, cause, err, len(kept), func(ctx context.Context) error { return fc.keepRecord(ctx, kept, recStatus) })
		}
		*buf = b
		putBuf(buf)
		if retrying {
			return
		}
	}
	outcome, err = settled(outcome, cause, err)
	f.emit(f.caller, outcome, status, err)
}

// encode encodes rec into a pooled buffer, returned as buf for the caller
// to put back (a store copies what it keeps of a record).
func (f *finish) encode(rec *httprec.Record) (b []byte, buf *[]byte, err error) {
	buf = getBuf()
	if b, err = rec.AppendBinary((*buf)[:0]); err != nil {
		putBuf(buf)
		return nil, nil, err
	}
	return b, buf, nil
}

// complete stores record b.
func (f *finish) complete(ctx context.Context, b []byte) error {
	return f.m.store.Complete(ctx, f.skey, f.owner, b, f.m.cfg.ttl)
}

// keepRecord completes the entry with b, the encoded record of a response
// sent with status. A store that refuses b for its size
// ([storage.ErrTooLarge]: a permanent refusal that changed nothing) gets
// instead a record that says only that the response was not kept, which
// any store takes: the key is done, and retries get 409 ErrNotReplayable
// (or WithRebuild's answer), never a second run. Treating the refusal as
// an outage would retry it for a lease and then free the key. The
// substitute's success is returned as a *refusedError, which [settled]
// turns into the NotReplayable outcome.
func (f *finish) keepRecord(ctx context.Context, b []byte, status int) error {
	err := f.complete(ctx, b)
	if !errors.Is(err, storage.ErrTooLarge) {
		return err
	}
	small, encErr := (&httprec.Record{Status: status, NotReplayable: true}).AppendBinary(nil)
	if encErr != nil { // b encoded with this status, so this one does
		return errors.Join(err, encErr)
	}
	if err2 := f.complete(ctx, small); errors.Is(err2, storage.ErrNotDurable) {
		return &refusedError{errors.Join(err, err2)}
	} else if err2 != nil {
		return err2
	}
	return &refusedError{err}
}

// refusedError is the result of [finish.keepRecord] when the store refused
// the record for its size and took the not-replayable record instead: it
// reads as the store's refusal, and is errRefused.
type refusedError struct{ err error }

func (e *refusedError) Error() string        { return e.err.Error() }
func (e *refusedError) Unwrap() error        { return e.err }
func (e *refusedError) Is(target error) bool { return target == errRefused }

// errRefused matches a *refusedError with errors.Is, which, unlike
// errors.As, moves nothing to the heap on the path every execution takes.
var errRefused = errors.New("idem: record refused for its size, kept as not replayable")

// emit tells the observer how the execution ended.
func (f *finish) emit(ctx context.Context, o Outcome, status int, err error) {
	if f.m.cfg.observer != nil {
		f.m.emit(Event{Outcome: o, Method: f.method, Route: f.route, Status: status,
			Duration: time.Since(f.start), Handler: f.handler, Retries: f.retries, Err: err, Context: ctx})
	}
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) <= 64<<10 {
		bufPool.Put(b)
	}
}

// Backoff of the background attempts.
const (
	retryFirst = 25 * time.Millisecond
	retryMax   = time.Second
)

// Bounds of the background attempts pending at once in one Middleware:
// each holds a goroutine and its record until the store takes it.
const (
	laterMax      = 10000
	laterMaxBytes = 256 << 20
)

// later is what happens when the store fails to take the result of an
// execution (Complete, or Release): the response has gone to the client,
// and without the record a retry after the lease would run the handler a
// second time. So the operation is retried in the background, with
// backoff, until the store accepts it, answers that the lease is gone
// (ErrNotOwner) or invalid, or one lease has passed: by then the entry has
// expired and every attempt would be refused. The last renewal left the
// entry at least two thirds of a lease, so a store outage shorter than that
// costs no second execution. The attempts keep the request's context
// values (not its cancellation), as the first one did.
// [Middleware.Shutdown] waits for them and makes them try at once. The
// observer hears the final result, with the last error the store itself
// gave: an attempt cut short by the end of the lease says only that time
// ran out.
//
// At most laterMax attempts, holding laterMaxBytes of records in all,
// are pending at once: past that, during a long outage, the execution is
// not retried and the observer hears StoreError with ErrRetryDropped at
// once (its key frees itself when the lease ends).
//
// op must own what it uses: the request's buffers are reused once the
// handler's request has finished. size is how many bytes it holds.
func (f *finish) later(outcome Outcome, status int, cause, first error, size int, op func(context.Context) error) {
	m := f.m
	if !m.pending.take(size) {
		outcome, err := settled(outcome, cause, fmt.Errorf("%w: %w", ErrRetryDropped, first))
		f.emit(f.caller, outcome, status, err)
		return
	}
	fc := *f // the goroutine's own copy; f stays on the handler's stack
	base := context.WithoutCancel(f.caller)
	deadline := time.Now().Add(m.cfg.lease)
	drain := m.work.add()
	go func() {
		defer m.work.done()
		defer m.pending.give(size)
		n, err := retry(base, deadline, drain, retryFirst, first, op)
		fc.retries += n
		outcome, err := settled(outcome, cause, err)
		fc.emitSafely(base, outcome, status, err)
	}()
}

// retry is the loop of the background attempts: it calls op, first after
// wait and then with a backoff that starts at retryFirst and doubles up
// to retryMax, each wait jittered (the attempts of many executions that
// failed together do not come back together), each call on a context that
// keeps base's values and ends at deadline, until op gives a definitive
// answer (nil, or an error that [retryable] refuses) or deadline passes.
// drain (from work.add) closed makes it try at once, and from then on
// without backing off. err is the error of the call before the first
// attempt. It returns how many attempts it made and the last error the
// store itself gave (an attempt cut short by the deadline says only that
// time ran out, so an earlier error is kept over it).
func retry(base context.Context, deadline time.Time, drain <-chan struct{}, wait time.Duration, err error, op func(context.Context) error) (int, error) {
	n := 0
	delay := wait
	t := time.NewTimer(time.Hour) // set before each wait
	defer t.Stop()
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return n, err
		}
		t.Reset(min(jitter(delay), left))
		select {
		case <-t.C:
		case <-drain: // shutting down: try at once, then without backing off
			drain = nil
		}
		if drain == nil {
			delay = retryFirst
		} else {
			delay = min(max(2*delay, retryFirst), retryMax)
		}
		ctx, cancel := context.WithDeadline(base, deadline)
		n++
		e := op(ctx)
		timedOut := ctx.Err() != nil
		cancel()
		if !retryable(e) {
			return n, e
		}
		if !timedOut || err == nil {
			err = e
		}
	}
}

// jitter returns a duration between half of d and d.
func jitter(d time.Duration) time.Duration { return d/2 + rand.N(d/2+1) }

// emitSafely is emit from a goroutine of the middleware's own: an observer
// that panics there would crash the process, so its panic is recovered
// and logged.
func (f *finish) emitSafely(ctx context.Context, o Outcome, status int, err error) {
	defer func() {
		if p := recover(); p != nil {
			log.Printf("idem: the observer panicked on a %s event: %v", o, p)
		}
	}()
	f.emit(ctx, o, status, err)
}

// pending counts the background attempts of a Middleware and the bytes
// they hold, within laterMax and laterMaxBytes.
type pending struct {
	mu       sync.Mutex
	n, bytes int
	max      int // laterMax, or less in tests
	maxBytes int
}

// take counts one more attempt holding size bytes, or reports false when
// that would pass a bound.
func (p *pending) take(size int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n+1 > p.max || p.bytes+size > p.maxBytes {
		return false
	}
	p.n++
	p.bytes += size
	return true
}

func (p *pending) give(size int) {
	p.mu.Lock()
	p.n--
	p.bytes -= size
	p.mu.Unlock()
}

// retryable reports whether a store error after the handler may go away
// by itself: not a refusal of the lease nor of the arguments, nor a value
// under the key that is not an entry, nor a record written whose
// durability is unconfirmed (storage.ErrNotDurable: nothing to retry).
func retryable(err error) bool {
	return err != nil && !errors.Is(err, storage.ErrNotOwner) && !errors.Is(err, storage.ErrInvalid) &&
		!errors.Is(err, storage.ErrCorrupt) && !errors.Is(err, storage.ErrTooLarge) && !errors.Is(err, storage.ErrNotDurable)
}

// settled is the outcome and error of an execution meant to end with
// outcome (and cause, such as the handler's panic) whose last store call
// returned err.
func settled(outcome Outcome, cause, err error) (Outcome, error) {
	switch {
	case errors.Is(err, errRefused):
		// Kept as done, not replayable: the event says why.
		if cause != nil {
			err = errors.Join(cause, err)
		}
		return NotReplayable, err
	case errors.Is(err, storage.ErrNotOwner):
		outcome, err = LeaseLost, fmt.Errorf("%w: %w", ErrLeaseLost, err)
	case errors.Is(err, storage.ErrNotDurable):
		// Stored: the outcome stands, and the event says what is unconfirmed.
	case err != nil:
		outcome = StoreError
	default:
		return outcome, cause
	}
	if cause != nil {
		err = errors.Join(cause, err)
	}
	return outcome, err
}

// finishCtx is the context of the store call that ends an execution: like
// context.WithTimeout(context.WithoutCancel(parent), lease), it keeps the
// request's values but not its cancellation (the client's disconnect must
// not stop the finish) and expires after the lease. Unlike it, it makes no
// channel, timer or wrapper until a store asks for Done, Err or a Value,
// which the memory store never does.
type finishCtx struct {
	parent   context.Context
	deadline time.Time

	mu     sync.Mutex
	values context.Context // context.WithoutCancel(parent), made on first use
	done   chan struct{}
	timer  *time.Timer
	err    error
}

// start readies c for one store call, expiring after d.
func (c *finishCtx) start(parent context.Context, d time.Duration) {
	c.parent, c.deadline = parent, time.Now().Add(d)
}

// stop cancels c once the store call has returned, as the cancel function
// of context.WithTimeout does: Done is closed and Err is context.Canceled
// unless it had expired.
func (c *finishCtx) stop() {
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.endLocked(context.Canceled)
	c.mu.Unlock()
}

func (c *finishCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *finishCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		if c.err != nil {
			return closedChan
		}
		c.done = make(chan struct{})
		if d := time.Until(c.deadline); d <= 0 {
			c.expireLocked()
		} else {
			c.timer = time.AfterFunc(d, c.expire)
		}
	}
	return c.done
}

func (c *finishCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil && !time.Now().Before(c.deadline) {
		c.expireLocked()
	}
	return c.err
}

func (c *finishCtx) Value(key any) any {
	c.mu.Lock()
	if c.values == nil {
		c.values = context.WithoutCancel(c.parent)
	}
	v := c.values
	c.mu.Unlock()
	return v.Value(key)
}

func (c *finishCtx) expire() {
	c.mu.Lock()
	c.expireLocked()
	c.mu.Unlock()
}

func (c *finishCtx) expireLocked() { c.endLocked(context.DeadlineExceeded) }

// endLocked ends c with err, closing Done, unless it has ended already.
func (c *finishCtx) endLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
}

// closedChan is the Done channel of a finishCtx that ended before anyone
// asked for it.
var closedChan = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()
