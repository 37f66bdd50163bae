package idem

import (
	"context"
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
	// StorageKey is the key of this request's entry in the store (a hash
	// of the scope, method, route and client key; never the client's input
	// as such), and TTL how long the entry is kept once done. A store
	// whose completion can join the application's own transaction (such as
	// a fence in the same database) needs both; both are empty when the
	// request is not protected.
	StorageKey string
	TTL        time.Duration
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
