package idem

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/storage"
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
	// StorageKey is the key of this request's entry in the store: a hash
	// of the scope, method, route and client key (of the operation and key,
	// for Do), never the client's input as such. It is the same for every
	// retry and differs between principals, so it can index the
	// application's own rows (find the order a first execution created,
	// in WithRebuild's function, say). Empty when WithFailOpen runs the
	// handler unprotected.
	StorageKey string
}

type ctxKey struct{}

// set makes c the context of an execution, under parent. A protected
// execution's context carries the storage.Lease too, for a store's fence
// (storage.LeaseFromContext), with ttl, the time its entry is kept once
// done.
func (c *infoCtx) set(parent context.Context, info Info, ttl time.Duration) {
	*c = infoCtx{Context: parent, info: info, ttl: ttl}
}

// infoCtx carries Info without a separate allocation for the value, and
// what MarkDone says.
type infoCtx struct {
	context.Context
	info Info
	ttl  time.Duration // the TTL of the execution's record
	done atomic.Bool   // MarkDone was called
}

// Value answers ctxKey with c and, for a protected execution,
// storage.LeaseKey with its lease (see storage.LeaseFromContext), built
// when asked: only a fence asks.
func (c *infoCtx) Value(k any) any {
	switch k {
	case ctxKey{}:
		return c
	case storage.LeaseKey{}:
		if c.info.Protected {
			return storage.Lease{Key: c.info.StorageKey, Owner: c.info.Owner, TTL: c.ttl}
		}
	}
	return c.Context.Value(k)
}

// MarkDone tells the middleware that the execution running under ctx (the
// context of a protected request, or of Do's function) must count as
// done, whatever it answers or returns next: its key is never released,
// so no retry runs it again. Use it when the handler cannot know whether
// its work took effect, as a proxy whose upstream timed out after the
// request was sent, or a payment call whose reply was lost: answering a
// 5xx then would release the key (see WithCacheable), and the retry would
// run the work a second time.
//
// A cacheable response sent whole is then stored and replayed as usual;
// any other answer (a 5xx, a panic, a canceled request, an error from
// Do's function) is stored as done but not replayable, so retries get 409
// ErrNotReplayable (or what WithRebuild answers). It reports whether ctx
// belongs to a protected execution; it does nothing and reports false
// otherwise (no key, a method or route not protected, WithFailOpen running
// the handler unprotected). It is safe to call from any goroutine, more
// than once.
func MarkDone(ctx context.Context) bool {
	c, ok := ctx.Value(ctxKey{}).(*infoCtx)
	if !ok || !c.info.Protected {
		return false
	}
	c.done.Store(true)
	return true
}

// FromContext returns the Info of the request whose context ctx is, or
// derives from. ok is false when the middleware did not run the handler
// (no key, a method or route it does not protect).
func FromContext(ctx context.Context) (info Info, ok bool) {
	c, ok := ctx.Value(ctxKey{}).(*infoCtx)
	if !ok {
		return Info{}, false
	}
	return c.info, true
}
