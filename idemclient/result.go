package idemclient

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Result is what the transport did for one protected request.
type Result struct {
	// Key is the idempotency key every attempt carried, as sent in the
	// header (the caller's own header value, the WithKey key, quoted if it
	// needed to be, or a generated one). Keep it out of logs: whoever has
	// it, and the caller's credentials, can read the stored response.
	Key string
	// Attempts is how many times the transport sent the request (the base
	// transport's own resend on a broken reused connection happens inside
	// one attempt and is not counted).
	Attempts int
	// Replayed is true when the response carries Idempotent-Replayed:
	// true: the server did not run the request for this response but sent
	// the one it stored when it first ran it.
	Replayed bool
	// Err is nil when the response is final by the retry table. Otherwise
	// the response still called for a retry (a 409 in flight, a 503, ...)
	// and Err says why none was made: it wraps ErrAttemptsExhausted,
	// ErrTimeExhausted or ErrBodyNotRewindable.
	Err error
}

// ResultOf returns the Result of the protected request that resp answers.
// ok is false when resp did not come from this package's transport for a
// protected request (a method it does not protect, another transport).
// After redirects followed by an [http.Client], resp answers the last
// request of the chain, and so does its Result.
//
// The transport finds it through resp.Request, the request it sent last,
// whose context carries the Result: it adds no response header.
func ResultOf(resp *http.Response) (res Result, ok bool) {
	if resp == nil || resp.Request == nil {
		return Result{}, false
	}
	c, ok := resp.Request.Context().Value(callKey{}).(*call)
	if !ok {
		return Result{}, false
	}
	return c.res, true
}

// Attempt is the outcome of one attempt of a protected request, given to
// the WithAttemptHook function. It never holds the idempotency key.
type Attempt struct {
	// Context is the request's context, for the trace and request ids it
	// holds.
	Context context.Context
	// Method and URL are the request's. The hook must not modify URL.
	Method string
	URL    *url.URL
	// N is the number of the attempt, 1 for the first.
	N int
	// StatusCode and Header are the attempt's response's status and
	// headers (for a Retry-After or a request id), 0 and nil when Err is
	// set. The hook must not modify Header.
	StatusCode int
	Header     http.Header
	// Replayed is true when the response carries Idempotent-Replayed: true.
	Replayed bool
	// Err is the error of the base RoundTripper, when it gave no response.
	Err error
	// Duration runs from the start of the attempt to its response's
	// headers or its error.
	Duration time.Duration
	// Retry is true when another attempt follows, after Wait.
	Retry bool
	// Wait is how long the transport waits before the next attempt, when
	// Retry is true: the server's Retry-After plus up to a tenth of it, or
	// the backoff.
	Wait time.Duration
	// Stop is set when the outcome called for a retry that will not be
	// made; it wraps ErrAttemptsExhausted, ErrTimeExhausted or
	// ErrBodyNotRewindable. Nil when the outcome is final (a success, a
	// replay, 400, 422, ...) or Retry is true.
	Stop error
}

// callKey is the context key of a protected request's call.
type callKey struct{}

// call is the state of one protected request. It is also the context of
// every attempt's request (the caller's context plus itself as a value),
// so that ResultOf finds it without another allocation.
type call struct {
	context.Context
	res Result
	hv  [1]string // the key header's value, when the transport sets it
}

// Value returns the call itself for callKey, else what the caller's
// context holds.
func (c *call) Value(k any) any {
	if k == (callKey{}) {
		return c
	}
	return c.Context.Value(k)
}

// String names the context the way the context package does, without the
// Result: printing a request's context never shows the key.
func (c *call) String() string {
	if s, ok := c.Context.(fmt.Stringer); ok {
		return s.String() + ".WithValue(idemclient.Result)"
	}
	return "context.WithValue(idemclient.Result)"
}
