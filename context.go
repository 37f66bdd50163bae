package idem

import (
	"context"
	"sync"
	"time"
)

// Info is what the middleware tells the handler about the request it runs.
type Info struct {
	// Key is the client's idempotency key, unquoted.
	Key string
	// Owner is the random token of the lease this execution holds. It
	// changes with every execution, so it can serve as a fencing token:
	// pass it downstream, or write it in the same transaction as the
	// business change and reject writes from a stale owner.
	Owner string
	// Protected is true when the middleware holds the lease for this
	// execution; false when WithFailOpen runs the handler unprotected
	// because the store failed.
	Protected bool
}

type ctxKey struct{}

// infoCtx carries Info without a separate allocation for the value.
type infoCtx struct {
	context.Context
	info Info
}

func (c *infoCtx) Value(k any) any {
	if k == (ctxKey{}) {
		return &c.info
	}
	return c.Context.Value(k)
}

// FromContext returns the Info of the request whose context ctx is, or
// derives from. ok is false when the middleware did not run the handler
// (no key, a method or route it does not protect).
func FromContext(ctx context.Context) (info Info, ok bool) {
	p, ok := ctx.Value(ctxKey{}).(*Info)
	if !ok {
		return Info{}, false
	}
	return *p, true
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
