package idem

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// Errors the middleware answers with. Each is the [errors.Is] target of the
// [*Error] handed to the error writer and of [Event.Err], and names the
// problem type of the RFC 9457 response: its type URI is the documentation
// of the value, for example
// https://pkg.go.dev/github.com/idemkit/idem#ErrConflict.
var (
	// ErrMissingKey: the request has no idempotency key and WithRequireKey
	// is set. Status 400.
	ErrMissingKey = errors.New("idempotency key missing")

	// ErrInvalidKey: the key is empty, longer than 255 bytes, not
	// printable ASCII, a malformed RFC 8941 string, or sent more than once.
	// Status 400.
	ErrInvalidKey = errors.New("idempotency key invalid")

	// ErrBodyTooLarge: the request body exceeds WithMaxRequestBody.
	// Status 413.
	ErrBodyTooLarge = errors.New("request body too large")

	// ErrBodyRead: the request body could not be read (the client went
	// away or sent a malformed body). Status 400.
	ErrBodyRead = errors.New("request body unreadable")

	// ErrConflict: a request with the same key is still being processed.
	// Status 409, with Retry-After: an estimate of when it will be done,
	// from the route's recent handler durations in this process (their
	// 90th percentile), at least 1 second and at most the lease it has
	// left; 1 second for a route that has not run here yet.
	ErrConflict = errors.New("request with this idempotency key in progress")

	// ErrMismatch: the key was already used with a different request
	// (method, path, query, Content-Type or body). Status 422.
	ErrMismatch = errors.New("idempotency key reused with a different request")

	// ErrNotReplayable: the original request completed but its response
	// could not be stored whole (larger than WithMaxResponseBody, the
	// connection was hijacked, or the connection failed while the handler
	// wrote a body without Content-Length, so that nothing tells whether
	// the handler wrote it all), so it cannot be replayed; the handler is
	// not run again. Status 409.
	ErrNotReplayable = errors.New("original response not stored")

	// ErrStoreUnavailable: the store could not be reached or is full, and
	// WithFailOpen is not set; the handler did not run. Status 503, with
	// Retry-After.
	ErrStoreUnavailable = errors.New("idempotency store unavailable")

	// ErrCanceled: the request's own context ended (the client went away,
	// or a deadline set before idem passed) while the middleware was asking
	// the store or waiting for the first request (WithWait); the handler did
	// not run and nothing was stored. Status 503, with Retry-After. The
	// client has usually gone; the answer is for a deadline's sake.
	ErrCanceled = errors.New("request canceled before it was processed")

	// ErrCorruptRecord: the stored record cannot be decoded, or fails its
	// checksum, or the value under the key is not an entry of the store
	// (storage.ErrCorrupt: a Redis hash, list or another application's
	// string). The handler is not run, not even WithFailOpen; a retry
	// cannot do better, so there is no Retry-After. Status 500.
	ErrCorruptRecord = errors.New("stored idempotency record corrupt")

	// ErrLeaseLost: the handler outlived its lease and another request took
	// the key; its response was sent to its client but not stored. Seen
	// only in [Event.Err]; the client is not told.
	ErrLeaseLost = errors.New("idempotency lease lost")

	// ErrRetryDropped: the store failed to take an execution's result, and
	// the middleware already had as many background retries pending as it
	// keeps (10,000, or 256 MiB of records): this one was not retried. Seen
	// only in [Event.Err] (outcome StoreError), with the store's error; the
	// key frees itself when its lease ends.
	ErrRetryDropped = errors.New("idempotency background retry dropped")

	// ErrKeyNotIssued: the middleware accepts issued keys only
	// (WithIssuedKeys), and this key was not issued by
	// [Middleware.IssueKey] to this client (the request's scope), or its
	// issue expired unused, or it was used and its record has expired.
	// Forged keys, other clients' keys and expired ones are not told
	// apart. The handler did not run. Status 400.
	ErrKeyNotIssued = errors.New("idempotency key not issued")

	// ErrTooManyKeys: [Middleware.IssueKey] refused to issue another key to
	// this client (its scope), which was issued as many keys as
	// WithIssueLimit allows a minute. Status 429, with Retry-After.
	ErrTooManyKeys = errors.New("too many idempotency keys issued")

	// ErrScopeUnknown: the request carries credentials (an Authorization
	// header) and no principal, and the middleware has no WithScope: idem
	// cannot tell whom the request acts for, and refuses to guess (a raw
	// credential is not a principal: a refreshed token would run the
	// operation again, and a principal read from a token nobody verified
	// would let a forged token read another principal's response). Name
	// the principal with [ContextWithPrincipal] in the authentication
	// middleware, or choose a scope with WithScope. The handler did not
	// run. Status 500: the server is misconfigured, not the client.
	ErrScopeUnknown = errors.New("idempotency scope unknown")

	// ErrInvalidOption: an option given to New has an invalid value.
	ErrInvalidOption = errors.New("idem: invalid option")
)

// Error is a refusal by the middleware: what the client is told, and why.
// It is what an [ErrorWriter] receives.
type Error struct {
	// Kind is one of the Err values of this package; errors.Is(e, Kind)
	// holds.
	Kind error
	// Status is the HTTP status to answer with.
	Status int
	// Title is a short, fixed summary of Kind.
	Title string
	// Detail explains this occurrence to the client. It never contains the
	// idempotency key, credentials or store internals.
	Detail string
	// RetryAfter, when positive, is sent as a Retry-After header in whole
	// seconds (at least 1).
	RetryAfter time.Duration
	// Err is the underlying cause, such as a store error. It is for logs
	// and observers, never sent to the client. May be nil.
	Err error
}

// Error returns "idem: " followed by Kind's text and the cause, if any.
func (e *Error) Error() string {
	s := "idem: " + e.Kind.Error()
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns Kind and the cause, so errors.Is matches both.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

// Type returns the RFC 9457 problem type URI for Kind.
func (e *Error) Type() string {
	if k, ok := kinds[e.Kind]; ok {
		return problemBase + k.name
	}
	return "about:blank"
}

const problemBase = "https://pkg.go.dev/github.com/idemkit/idem#"

type kind struct {
	name   string
	status int
	title  string
}

var kinds = map[error]kind{
	ErrMissingKey:       {"ErrMissingKey", http.StatusBadRequest, "Idempotency key missing"},
	ErrInvalidKey:       {"ErrInvalidKey", http.StatusBadRequest, "Invalid idempotency key"},
	ErrBodyTooLarge:     {"ErrBodyTooLarge", http.StatusRequestEntityTooLarge, "Request body too large"},
	ErrBodyRead:         {"ErrBodyRead", http.StatusBadRequest, "Request body unreadable"},
	ErrConflict:         {"ErrConflict", http.StatusConflict, "Request in progress"},
	ErrMismatch:         {"ErrMismatch", http.StatusUnprocessableEntity, "Idempotency key reused"},
	ErrNotReplayable:    {"ErrNotReplayable", http.StatusConflict, "Original response not stored"},
	ErrStoreUnavailable: {"ErrStoreUnavailable", http.StatusServiceUnavailable, "Idempotency store unavailable"},
	ErrCorruptRecord:    {"ErrCorruptRecord", http.StatusInternalServerError, "Stored response unreadable"},
	ErrCanceled:         {"ErrCanceled", http.StatusServiceUnavailable, "Request canceled"},
	ErrKeyNotIssued:     {"ErrKeyNotIssued", http.StatusBadRequest, "Idempotency key not issued"},
	ErrTooManyKeys:      {"ErrTooManyKeys", http.StatusTooManyRequests, "Too many idempotency keys"},
	ErrScopeUnknown:     {"ErrScopeUnknown", http.StatusInternalServerError, "Idempotency scope unknown"},
}

// newError builds the refusal for kind k.
func newError(k error, detail string, retryAfter time.Duration, cause error) *Error {
	kd := kinds[k]
	return &Error{Kind: k, Status: kd.status, Title: kd.title, Detail: detail, RetryAfter: retryAfter, Err: cause}
}

// ErrorWriter writes a refusal to the client. The default,
// [WriteProblem], writes an RFC 9457 application/problem+json body.
// Replace it with WithErrorWriter to match an API's own error format; it
// must write a response with e.Status.
type ErrorWriter func(w http.ResponseWriter, r *http.Request, e *Error)

type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// WriteProblem is the default [ErrorWriter]. It answers with e.Status, a
// Retry-After header when e.RetryAfter is positive, Cache-Control: no-store,
// and an application/problem+json body with type, title, status and detail.
func WriteProblem(w http.ResponseWriter, _ *http.Request, e *Error) {
	body, _ := json.Marshal(problem{Type: e.Type(), Title: e.Title, Status: e.Status, Detail: e.Detail})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(retrySeconds(e.RetryAfter), 10))
	}
	w.WriteHeader(e.Status)
	w.Write(append(body, '\n'))
}

// retrySeconds rounds d up to whole seconds, at least 1.
func retrySeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}
