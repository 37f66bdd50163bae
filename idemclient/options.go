package idemclient

import (
	"fmt"
	"net/http"
	"net/textproto"
	"time"
)

// Defaults of the options.
const (
	// DefaultHeader is the header that carries the key.
	DefaultHeader = "Idempotency-Key"
	// DefaultMaxAttempts is how many times a request is sent at most.
	DefaultMaxAttempts = 5
	// DefaultMaxElapsed bounds the time from the first attempt to the
	// start of the last one. It outlasts one default lease of the kit's
	// middleware (30 s): how long a key stays in flight (409) after the
	// process that ran the first request died. Waiting that out also takes
	// attempts enough: a 409's Retry-After is often 1 s, so raise
	// WithMaxAttempts where a client must ride out such a crash.
	DefaultMaxElapsed = time.Minute
	// DefaultBackoffBase and DefaultBackoffMax shape the backoff between
	// attempts that got no Retry-After: a random wait between 0 and
	// min(DefaultBackoffMax, DefaultBackoffBase * 2^(n-1)) after attempt n.
	DefaultBackoffBase = 250 * time.Millisecond
	DefaultBackoffMax  = 10 * time.Second
	// DefaultMaxBufferedBody is the largest body without GetBody that is
	// buffered so that it can be sent again. It matches the kit's
	// WithMaxRequestBody default: a larger body gets 413 from it anyway.
	DefaultMaxBufferedBody = 1 << 20
)

// Option configures a [Transport]. New panics on an invalid value (a
// programming error, as with [regexp.MustCompile]); each option says which
// values are invalid.
type Option func(*config)

type config struct {
	base        http.RoundTripper
	header      string
	methods     []string
	maxAttempts int
	maxElapsed  time.Duration
	backoffBase time.Duration
	backoffMax  time.Duration
	maxBody     int64
	hook        func(Attempt)
}

func defaults() config {
	return config{
		base:        http.DefaultTransport,
		header:      DefaultHeader,
		methods:     []string{http.MethodPost, http.MethodPatch},
		maxAttempts: DefaultMaxAttempts,
		maxElapsed:  DefaultMaxElapsed,
		backoffBase: DefaultBackoffBase,
		backoffMax:  DefaultBackoffMax,
		maxBody:     DefaultMaxBufferedBody,
	}
}

// WithBase sets the RoundTripper that sends each attempt. Default
// [http.DefaultTransport]; nil means the default.
func WithBase(rt http.RoundTripper) Option {
	return func(c *config) {
		if rt == nil {
			rt = http.DefaultTransport
		}
		c.base = rt
	}
}

// WithHeader sets the header that carries the key; it must be the one the
// server reads. Default "Idempotency-Key". The name must be a valid header
// name (an HTTP token). Go's [http.Transport] resends a request on a
// broken reused connection by itself only when it carries Idempotency-Key
// or X-Idempotency-Key; with another name only this transport retries.
func WithHeader(name string) Option {
	return func(c *config) {
		if !isToken(name) {
			panic(fmt.Sprintf("idemclient: WithHeader(%q): not a valid header name", name))
		}
		c.header = textproto.CanonicalMIMEHeaderKey(name)
	}
}

// WithMethods sets the methods this transport protects: their requests get
// a key and are retried by the table of the package documentation. Default
// POST and PATCH, the kit's middleware's default. Requests with other
// methods are passed to the base RoundTripper untouched, even when they
// carry a key (http.Transport still retries the idempotent ones, such as
// GET, on a broken reused connection). Methods are case-sensitive, as in
// HTTP; at least one valid method is required.
func WithMethods(methods ...string) Option {
	return func(c *config) {
		if len(methods) == 0 {
			panic("idemclient: WithMethods needs at least one method")
		}
		for _, m := range methods {
			if !isToken(m) {
				panic(fmt.Sprintf("idemclient: WithMethods: %q is not a valid method", m))
			}
		}
		c.methods = append([]string(nil), methods...)
	}
}

// WithMaxAttempts sets how many times a request is sent at most, the
// first attempt included: 1 disables retries. Default 5. n < 1 is
// invalid. Every attempt counts, the ones after a 409 included; the base
// transport's own resend on a broken reused connection (see the package
// documentation) happens inside one attempt.
func WithMaxAttempts(n int) Option {
	return func(c *config) {
		if n < 1 {
			panic(fmt.Sprintf("idemclient: WithMaxAttempts(%d): must be at least 1", n))
		}
		c.maxAttempts = n
	}
}

// WithMaxElapsed bounds the time from the start of the first attempt to
// the start of the last: no wait is begun that would end later, and the
// last response (or an [*Error] wrapping ErrTimeExhausted) is returned at
// once instead. Default 1 minute; 0 means no bound but the request
// context's deadline, which is always respected. d < 0 is invalid.
func WithMaxElapsed(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			panic(fmt.Sprintf("idemclient: WithMaxElapsed(%v): must not be negative", d))
		}
		c.maxElapsed = d
	}
}

// WithBackoff sets the exponential backoff with full jitter used between
// attempts when the server gave no Retry-After: after attempt n the
// transport waits a random time between 0 and min(max, base * 2^(n-1)).
// Default 250 ms and 10 s. base must be positive and max at least base.
func WithBackoff(base, max time.Duration) Option {
	return func(c *config) {
		if base <= 0 || max < base {
			panic(fmt.Sprintf("idemclient: WithBackoff(%v, %v): base must be positive and max at least base", base, max))
		}
		c.backoffBase, c.backoffMax = base, max
	}
}

// WithMaxBufferedBody sets the largest request body without GetBody that
// the transport reads into memory so that a retry can send it again.
// Default 1 MiB. A body with GetBody (what [http.NewRequest] sets for a
// [bytes.Reader], [bytes.Buffer] or [strings.Reader]) is never buffered. A
// larger body is sent once, as it streams; if that attempt calls for a
// retry, the transport returns an [*Error] wrapping ErrBodyNotRewindable
// (or the response, with Result.Err wrapping it). 0 means never buffer;
// n < 0 is invalid.
func WithMaxBufferedBody(n int64) Option {
	return func(c *config) {
		if n < 0 {
			panic(fmt.Sprintf("idemclient: WithMaxBufferedBody(%d): must not be negative", n))
		}
		c.maxBody = n
	}
}

// WithAttemptHook sets a function called after every attempt of a
// protected request, with its outcome and what the transport does next:
// for logs and metrics. It runs on the goroutine of RoundTrip, before the
// wait; it must not block for long. An [Attempt] never holds the key.
// Default none.
func WithAttemptHook(fn func(Attempt)) Option {
	return func(c *config) { c.hook = fn }
}

// isToken reports whether s is a non-empty HTTP token (RFC 9110, 5.6.2).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '!' || c == '#' || c == '$' || c == '%' || c == '&' || c == '\'' || c == '*' ||
			c == '+' || c == '-' || c == '.' || c == '^' || c == '_' || c == '`' || c == '|' || c == '~':
		default:
			return false
		}
	}
	return true
}
