package idemclient

import (
	"errors"
	"strconv"
)

// Errors of the transport. Compare with [errors.Is]: RoundTrip wraps them
// (in an [*Error] or with the cause), and [http.Client] wraps what
// RoundTrip returns in a [*url.Error].
var (
	// ErrAttemptsExhausted: the last attempt called for a retry but
	// WithMaxAttempts attempts were made.
	ErrAttemptsExhausted = errors.New("idemclient: attempts exhausted")

	// ErrTimeExhausted: the last attempt called for a retry but the wait
	// before the next one (Retry-After or the backoff) would end after
	// WithMaxElapsed from the first attempt, or at or after the request
	// context's deadline.
	ErrTimeExhausted = errors.New("idemclient: retry time exhausted")

	// ErrBodyNotRewindable: the last attempt called for a retry but its
	// body cannot be sent again: it has no GetBody and is larger than
	// WithMaxBufferedBody, or GetBody failed (the error wraps GetBody's
	// error too).
	ErrBodyNotRewindable = errors.New("idemclient: request body cannot be sent again")

	// ErrInvalidKey: the key given to WithKey is empty, longer than 255
	// bytes or not printable ASCII. The request was not sent.
	ErrInvalidKey = errors.New("idemclient: invalid idempotency key")
)

// Error is what RoundTrip returns when it stops retrying a request whose
// last attempt failed without a response, although the failure called for
// a retry: Reason is ErrAttemptsExhausted, ErrTimeExhausted or (a wrapper
// of) ErrBodyNotRewindable, and Err the last attempt's error. errors.Is
// matches both. It never contains the idempotency key.
//
// An error that calls for no retry (the request's context ended, a TLS
// certificate was refused, the host does not exist) is returned as the
// base RoundTripper gave it, not in an Error.
type Error struct {
	// Reason says why no further attempt was made.
	Reason error
	// Attempts is how many times the request was sent.
	Attempts int
	// Err is the last attempt's error.
	Err error
}

// Error returns the reason, the number of attempts and the last error.
func (e *Error) Error() string {
	return e.Reason.Error() + " after " + strconv.Itoa(e.Attempts) + " attempt(s): " + e.Err.Error()
}

// Unwrap returns Reason and Err, so errors.Is and errors.As match both.
func (e *Error) Unwrap() []error { return []error{e.Reason, e.Err} }

// Timeout reports whether the last attempt's error was a timeout, so that
// [url.Error.Timeout] (what [http.Client] returns) tells it.
func (e *Error) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}
