package idem

import (
	"context"
	"strconv"
	"time"
)

// Outcome is what the middleware decided for one request.
type Outcome uint8

// The outcomes an [Event] reports.
const (
	// Executed: the handler ran and its response was stored. Err wraps
	// storage.ErrNotDurable when the store wrote it but could not confirm
	// the durability it waits for (a Redis store's WithDurability).
	Executed Outcome = iota + 1
	// Replayed: a stored response was sent again.
	Replayed
	// Conflict: 409; Err is ErrConflict (the first request is in flight)
	// or ErrNotReplayable (it completed, its response was not stored).
	Conflict
	// Mismatch: 422, the key was used with a different request.
	Mismatch
	// Released: the handler ran and its response was not cacheable (5xx by
	// default), or it panicked before sending anything (Err is a
	// *PanicError), so the key was released for a retry.
	Released
	// NotReplayable: the handler ran but its response could not be kept
	// whole (too large, hijacked, the connection failed before the handler
	// had written all it meant to, it panicked after the response started
	// to go out (Err is the *PanicError), it called MarkDone and answered
	// a status that is not cacheable, or the store refused the record as
	// too large (Err wraps storage.ErrTooLarge)); the key is done and
	// retries get 409.
	NotReplayable
	// Rejected: 400 or 413, the key or the body was refused before any
	// store access, or the key was not issued (ErrKeyNotIssued, see
	// WithIssuedKeys); or 500, the request carries credentials and names
	// no principal under the default scope (ErrScopeUnknown, see
	// WithScope), refused before any store access. Err says why.
	Rejected
	// StoreError: the store failed. Before the handler this means 503 (or
	// 500 for a corrupt record); after it, the response was sent but could
	// not be stored or released even by the retries of the following lease
	// (Err is the last error the store gave), and the key frees itself when
	// its lease ends.
	StoreError
	// FailedOpen: the store failed and WithFailOpen ran the handler
	// unprotected.
	FailedOpen
	// LeaseLost: the handler ran but outlived its lease and another request
	// took the key; nothing was overwritten.
	LeaseLost
	// Canceled: the request's own context ended (the client went away, or
	// a deadline passed) and nothing was stored. Either before the handler
	// ran, while the store was asked or a duplicate waited (WithWait): the
	// answer is 503 with ErrCanceled, and the store is not at fault; or while
	// it ran, when the handler then returned without writing anything: the
	// key was released, so a retry runs it. Err wraps the context's error.
	Canceled
	// Rebuilt: the first request completed but its response was not kept,
	// and the function given to WithRebuild answered from the
	// application's own data.
	Rebuilt
)

var outcomeNames = [...]string{
	Executed: "executed", Replayed: "replayed", Conflict: "conflict", Mismatch: "mismatch",
	Released: "released", NotReplayable: "not-replayable", Rejected: "rejected",
	StoreError: "store-error", FailedOpen: "failed-open", LeaseLost: "lease-lost",
	Canceled: "canceled", Rebuilt: "rebuilt",
}

// String returns the outcome's name in lower case with dashes, such as
// "executed" or "store-error", fit for a metric label.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && outcomeNames[o] != "" {
		return outcomeNames[o]
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Event describes one decision, for metrics, traces and logs. It never
// holds the idempotency key, the scope or credentials. The observer gets
// one per protected request (see [WithObserver]).
type Event struct {
	// Outcome is what was decided.
	Outcome Outcome
	// Method is the request's method; empty for [Middleware.Do].
	Method string
	// Route is the route pattern the record is scoped by, as every adapter
	// reports it: "/orders/{id}" on net/http (the pattern without its
	// method), "/orders/:id" on Gin and Echo; the URL path around a handler
	// that is not a mux; the operation for [Middleware.Do].
	Route string
	// Status is the status sent to the client: the handler's, a replay's,
	// or the refusal's; 0 when the connection was hijacked or for
	// FailedOpen (the handler's status is not watched).
	Status int
	// Duration runs from the start of the middleware to the decision,
	// including the handler when it ran, and the background retries of the
	// finish when there were some.
	Duration time.Duration
	// Handler is how long the handler (or Do's function) ran, until it
	// returned or panicked; 0 when it did not run (a replay, a conflict, a
	// refusal, FailedOpen).
	Handler time.Duration
	// Retries is how many times the middleware tried again, in the
	// background, to store the result or release the key after the
	// store failed when the handler had finished (see WithLease); 0 when
	// the first attempt did.
	Retries int
	// Err is nil for Executed, Replayed and Released after a normal
	// return (for [Middleware.Do], Released carries fn's error), but for
	// an Executed whose record's durability the store could not confirm
	// (storage.ErrNotDurable).
	// Otherwise it wraps one of the package's Err values, the
	// store's error for store failures, a *PanicError when the handler
	// panicked, or the context's error for Canceled. Use errors.Is and
	// errors.As.
	Err error
	// Context is the request's context, for the trace and request ids that
	// middleware before idem put in it. For an event sent after a
	// background retry it keeps those values but is no longer canceled with
	// the request. Never nil.
	Context context.Context
}
