package storage

import (
	"context"
	"time"
)

// Lease names the entry that the execution running under a context holds:
// what a store needs to join the application's own transaction to that
// entry (pgstore's Fence), and what a fence written for another database
// writes in its transaction.
type Lease struct {
	// Key is the entry's key, as the store is given it.
	Key string
	// Owner is the execution's owner token: it changes with every
	// execution, so it serves as a fencing token.
	Owner string
	// TTL is how long the entry is kept once the execution is done.
	TTL time.Duration
}

// LeaseKey is the context key of a Lease: a context carries l when its
// Value(LeaseKey{}) answers l. [ContextWithLease] makes such a context; a
// Context type of its own may answer the key itself (the middleware's
// does, so that a protected execution does not allocate a context and a
// boxed Lease that only a fence reads).
type LeaseKey struct{}

// ContextWithLease returns a copy of ctx that carries l. The idem
// middleware gives every execution it runs under a lease such a context
// (a request's, or the one Do passes its function); a test calls it to
// run a handler that fences without the middleware.
func ContextWithLease(ctx context.Context, l Lease) context.Context {
	return context.WithValue(ctx, LeaseKey{}, l)
}

// LeaseFromContext returns the Lease that ctx, or a context it derives
// from, carries. ok is false when it carries none: the execution is not
// protected (no key, a route or method the middleware does not cover,
// or WithFailOpen running it without a lease because the store failed).
func LeaseFromContext(ctx context.Context) (l Lease, ok bool) {
	l, ok = ctx.Value(LeaseKey{}).(Lease)
	return l, ok
}
