package idem

import (
	"strconv"
	"time"
)

// Outcome is what the middleware decided for one request.
type Outcome uint8

// The outcomes an [Event] reports.
const (
	// Executed: the handler ran and its response was stored.
	Executed Outcome = iota + 1
	// Replayed: a stored response was sent again.
	Replayed
	// Conflict: 409; Err is ErrConflict (the first request is in flight)
	// or ErrNotReplayable (it completed, its response was not stored).
	Conflict
	// Mismatch: 422, the key was used with a different request.
	Mismatch
	// Released: the handler ran (or panicked) and its response was not
	// cacheable, so the key was released for a retry.
	Released
	// NotReplayable: the handler ran but its response could not be kept
	// (too large, hijacked); the key is done and retries get 409.
	NotReplayable
	// Rejected: 400 or 413, the key or the body was refused before any
	// store access. Err says why.
	Rejected
	// StoreError: the store failed. Before the handler this means 503 (or
	// 500 for a corrupt record); after it, the response was sent but could
	// not be stored or released even by the retries of the following lease,
	// and the key frees itself when its lease ends.
	StoreError
	// FailedOpen: the store failed and WithFailOpen ran the handler
	// unprotected.
	FailedOpen
	// LeaseLost: the handler ran but outlived its lease and another request
	// took the key; nothing was overwritten.
	LeaseLost
)

var outcomeNames = [...]string{
	Executed: "executed", Replayed: "replayed", Conflict: "conflict", Mismatch: "mismatch",
	Released: "released", NotReplayable: "not-replayable", Rejected: "rejected",
	StoreError: "store-error", FailedOpen: "failed-open", LeaseLost: "lease-lost",
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
// holds the idempotency key, the scope or credentials.
type Event struct {
	Outcome Outcome
	// Method and Route of the request; Route is the framework's route
	// pattern, or the URL path when there is none.
	Method, Route string
	// Status sent to the client (0 when the connection was hijacked).
	Status int
	// Duration from the start of the middleware to the decision, including
	// the handler when it ran.
	Duration time.Duration
	// Err is nil for Executed, Replayed and Released after a normal
	// return; otherwise it wraps one of the package's Err values and, for
	// store failures, the store's error. For Released after a panic it
	// holds the panic value as text.
	Err error
}
