package grpcidem

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// Metadata keys of the protocol.
const (
	// DefaultKeyHeader is the metadata key that carries the idempotency
	// key, on the server's side (WithKeyHeader) and the client's
	// (WithClientKeyHeader).
	DefaultKeyHeader = "idempotency-key"
	// ReplayedHeader is the header metadata entry, "true", of a replay.
	ReplayedHeader = "idempotent-replayed"
	// RetryAfterHeader is the header metadata entry of an Aborted (a call
	// with the same key in flight) or Unavailable (the store is down)
	// refusal: whole seconds, at least 1, as HTTP's Retry-After.
	RetryAfterHeader = "retry-after"
)

// Option configures [UnaryServerInterceptor]. An option given an invalid
// value panics (a programming error, as with [regexp.MustCompile]); each
// option says which values are invalid.
type Option func(*config)

// config is what the server's options set.
type config struct {
	header     string
	requireKey bool
	scope      func(ctx context.Context) string // nil: the principal (see WithScope)
	noFP       bool
	stored     func(codes.Code) bool
	methods    map[string]bool // nil: every method
	maxReply   int
}

func defaultConfig() config {
	return config{header: DefaultKeyHeader, stored: DefaultStored, maxReply: DefaultMaxReply}
}

// DefaultMaxReply is the default of [WithMaxReply]: 4 MiB, gRPC's
// default limit on the messages a client receives (MaxCallRecvMsgSize),
// so that every reply a client with default settings can receive is kept.
const DefaultMaxReply = 4 << 20

// replyRoom is what a record may hold beside its message: the metadata
// the handler set, the message's type name, the lengths.
const replyRoom = 64 << 10

// WithMaxReply bounds the replies that are kept for replay: a reply whose
// message, marshalled, is larger than n bytes (the response, or the
// status with its details), or whose metadata and type name take more
// than 64 KiB beside it, reaches its caller as usual, and the key is kept
// done, not replayable: a retry gets FailedPrecondition,
// [ReasonNotReplayable], and the handler does not run again. It takes the
// place, for gRPC's replies, of idem.WithMaxResponseBody, the bound of
// HTTP responses (1 MiB by default), which does not apply here. Default
// [DefaultMaxReply], 4 MiB; set it to the server's grpc.MaxSendMsgSize,
// or the clients' MaxCallRecvMsgSize, when those are raised. n < 1 is
// invalid.
func WithMaxReply(n int) Option {
	if n < 1 {
		panic(fmt.Sprintf("grpcidem: WithMaxReply(%d): must be positive", n))
	}
	return func(c *config) { c.maxReply = n }
}

// WithKeyHeader sets the metadata key that carries the idempotency key;
// the client must send it there (see [WithClientKeyHeader]). Default
// "idempotency-key". Metadata keys are lower case: the name is lowered. A
// name that is empty, holds a character other than a-z, 0-9, "-", "_" and
// ".", starts with "grpc-" (reserved) or ends with "-bin" (binary values)
// is invalid.
func WithKeyHeader(name string) Option {
	name = checkHeader("WithKeyHeader", name)
	return func(c *config) { c.header = name }
}

// WithRequireKey answers InvalidArgument to a call that carries no key,
// without running the handler. By default such a call passes through
// unprotected.
func WithRequireKey() Option {
	return func(c *config) { c.requireKey = true }
}

// WithScope sets the function that names the principal (user, tenant, API
// client) a call acts for, from the call's context (its metadata, or what
// an authentication interceptor before this one put in it). Records of
// different scopes never meet: two clients choosing the same key never
// see each other's responses. The scope is hashed into the record's name,
// never stored in clear. A nil function is invalid.
//
// Without WithScope the scope is HTTP's default (see idem.WithScope): the
// principal that the service's authentication interceptor, chained before
// this one, named with idem.ContextWithPrincipal once it verified the
// call's credentials; a call that names none and carries no
// "authorization" metadata is anonymous (anonymous calls share the empty
// scope); a call that names none and carries "authorization" metadata is
// refused with Internal (idem.ErrScopeUnknown: the service is
// misconfigured, not the call) before the store is asked or the handler
// runs. A raw credential is not a principal: per-call credentials
// (grpc.WithPerRPCCredentials) and refreshed OAuth tokens change it
// between the attempts of one call, which would run the handler again.
// [AuthorizationScope] is the scope of credentials that never change.
func WithScope(fn func(ctx context.Context) string) Option {
	if fn == nil {
		panic("grpcidem: WithScope(nil)")
	}
	return func(c *config) { c.scope = fn }
}

// AuthorizationScope is the scope of the call's "authorization" metadata
// value, whole (several values joined), as idem.AuthorizationScope is the
// Authorization header's; calls without one share the empty scope. It was
// the default before the principal was: give it to WithScope for
// credentials that never change between the attempts of a call (a static
// API key). A credential that changes (a token minted per call, an OAuth
// token refreshed) puts a retry in another scope, and the handler runs
// again.
func AuthorizationScope(ctx context.Context) string {
	vs := metadata.ValueFromIncomingContext(ctx, "authorization")
	if len(vs) == 1 {
		return vs[0]
	}
	return strings.Join(vs, "\n")
}

// WithoutFingerprint turns the request comparison off: a call with a key
// already used gets that key's response whatever its request message. By
// default the request is deterministically marshalled and a hash of it
// kept with the key: a call with the same key and another request gets
// FailedPrecondition, and the request must be a protocol buffer message.
func WithoutFingerprint() Option {
	return func(c *config) { c.noFP = true }
}

// WithStoredCodes decides which status codes that a handler returns as its
// error are stored and replayed; for the others the key is released, so
// that a retry runs the handler again. A response (OK) is always stored.
// Default [DefaultStored]. A nil function is invalid.
func WithStoredCodes(fn func(codes.Code) bool) Option {
	if fn == nil {
		panic("grpcidem: WithStoredCodes(nil)")
	}
	return func(c *config) { c.stored = fn }
}

// DefaultStored is the default rule of [WithStoredCodes], the counterpart
// of HTTP's cacheable statuses. It stores the codes that say the call was
// answered and a retry would get the same answer: InvalidArgument,
// NotFound, AlreadyExists, FailedPrecondition, PermissionDenied,
// OutOfRange, Unimplemented and Unauthenticated (and OK). It releases the
// codes that say the call may not have happened or asks for a retry:
// Unavailable, ResourceExhausted, Aborted, Internal, Unknown,
// DeadlineExceeded, Canceled and DataLoss, and any code it does not know.
func DefaultStored(code codes.Code) bool {
	switch code {
	case codes.OK, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.FailedPrecondition,
		codes.PermissionDenied, codes.OutOfRange, codes.Unimplemented, codes.Unauthenticated:
		return true
	}
	return false
}

// WithMethods limits the interceptor to the named methods (full names,
// "/package.Service/Method", as grpc.UnaryServerInfo.FullMethod gives
// them): the calls of other methods pass through untouched, key or not.
// Default: every unary method of the server. No name, or a name that does
// not start with "/", is invalid.
func WithMethods(fullMethods ...string) Option {
	set := methodSet("WithMethods", fullMethods)
	return func(c *config) { c.methods = set }
}

// ClientOption configures [UnaryClientInterceptor]. An option given an
// invalid value panics; each option says which values are invalid.
type ClientOption func(*clientConfig)

// Defaults of the client's options, those of the kit's HTTP client
// (idemclient) but for the backoff's base.
const (
	// DefaultMaxAttempts is how many times a call is sent at most.
	DefaultMaxAttempts = 5
	// DefaultMaxElapsed bounds the time from the first attempt to the
	// start of the last one.
	DefaultMaxElapsed = time.Minute
	// DefaultBackoffBase and DefaultBackoffMax shape the backoff between
	// attempts that got no delay from the server: a random wait between 0
	// and min(DefaultBackoffMax, DefaultBackoffBase * 2^(n-1)) after
	// attempt n.
	DefaultBackoffBase = 100 * time.Millisecond
	DefaultBackoffMax  = 10 * time.Second
)

// clientConfig is what the client's options set.
type clientConfig struct {
	header      string
	methods     map[string]bool // nil: every method
	maxAttempts int
	maxElapsed  time.Duration
	backoffBase time.Duration
	backoffMax  time.Duration
	perAttempt  time.Duration // 0: none
	hook        func(Attempt)
}

func defaultClientConfig() clientConfig {
	return clientConfig{
		header:      DefaultKeyHeader,
		maxAttempts: DefaultMaxAttempts,
		maxElapsed:  DefaultMaxElapsed,
		backoffBase: DefaultBackoffBase,
		backoffMax:  DefaultBackoffMax,
	}
}

// WithClientKeyHeader sets the metadata key that carries the key; it must
// be the one the server reads. Default "idempotency-key"; the rules of
// [WithKeyHeader].
func WithClientKeyHeader(name string) ClientOption {
	name = checkHeader("WithClientKeyHeader", name)
	return func(c *clientConfig) { c.header = name }
}

// WithClientMethods limits the interceptor to the named methods (full
// names, "/package.Service/Method"): the calls of other methods, such as
// reads that need no key, go to the connection untouched: no key, no
// retry. Default: every unary method. No name, or a name that does not
// start with "/", is invalid.
func WithClientMethods(fullMethods ...string) ClientOption {
	set := methodSet("WithClientMethods", fullMethods)
	return func(c *clientConfig) { c.methods = set }
}

// WithMaxAttempts sets how many times a call is sent at most, the first
// attempt included: 1 disables retries. Default 5. Every attempt counts,
// those that got Aborted included. n < 1 is invalid.
func WithMaxAttempts(n int) ClientOption {
	if n < 1 {
		panic(fmt.Sprintf("grpcidem: WithMaxAttempts(%d): must be at least 1", n))
	}
	return func(c *clientConfig) { c.maxAttempts = n }
}

// WithMaxElapsed bounds the time from the start of the first attempt to
// the start of the last: no wait is begun that would end later, and the
// last status is returned at once instead. Default 1 minute; 0 means no
// bound but the context's deadline, which is always respected. d < 0 is
// invalid.
func WithMaxElapsed(d time.Duration) ClientOption {
	if d < 0 {
		panic(fmt.Sprintf("grpcidem: WithMaxElapsed(%v): must not be negative", d))
	}
	return func(c *clientConfig) { c.maxElapsed = d }
}

// WithBackoff sets the exponential backoff with full jitter used between
// attempts when the server gave no delay: after attempt n the interceptor
// waits a random time between 0 and min(max, base * 2^(n-1)). Default
// 100 ms and 10 s. base must be positive and max at least base.
func WithBackoff(base, max time.Duration) ClientOption {
	if base <= 0 || max < base {
		panic(fmt.Sprintf("grpcidem: WithBackoff(%v, %v): base must be positive and max at least base", base, max))
	}
	return func(c *clientConfig) { c.backoffBase, c.backoffMax = base, max }
}

// WithPerAttemptTimeout gives each attempt of a protected call its own
// deadline, d after it starts (or the call's, when that comes first), as
// go-grpc-middleware's retry does with WithPerRetryTimeout: an attempt
// that ends DeadlineExceeded because its own deadline passed, while the
// call's context is still alive, is retried with the same key after the
// backoff. That is safe because of the key: the server may still be
// running the first attempt's handler, and the retry then gets Aborted
// (the key in flight), waits, and gets its answer replayed; or the first
// attempt released the key, and the retry runs it. Default none: an
// attempt has the call's deadline only. d < 0 is invalid; 0 means none.
func WithPerAttemptTimeout(d time.Duration) ClientOption {
	if d < 0 {
		panic(fmt.Sprintf("grpcidem: WithPerAttemptTimeout(%v): must not be negative", d))
	}
	return func(c *clientConfig) { c.perAttempt = d }
}

// WithAttemptHook sets a function called after every attempt of a
// protected call, with its outcome and what the interceptor does next:
// for logs and metrics. It runs on the caller's goroutine, before the
// wait; it must not block for long. An [Attempt] never holds the key.
// Default none.
func WithAttemptHook(fn func(Attempt)) ClientOption {
	return func(c *clientConfig) { c.hook = fn }
}

// checkHeader lowers name and panics, naming the option, if it is not a
// metadata key fit to carry a key.
func checkHeader(option, name string) string {
	name = strings.ToLower(name)
	ok := name != "" && !strings.HasPrefix(name, "grpc-") && !strings.HasSuffix(name, "-bin")
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.'
	}
	if !ok {
		panic(fmt.Sprintf("grpcidem: %s(%q): not a metadata key for text values", option, name))
	}
	return name
}

// methodSet returns the set of full method names, panicking, naming the
// option, on an invalid one.
func methodSet(option string, names []string) map[string]bool {
	if len(names) == 0 {
		panic("grpcidem: " + option + ": no method")
	}
	set := make(map[string]bool, len(names))
	for _, n := range names {
		if !strings.HasPrefix(n, "/") {
			panic(fmt.Sprintf("grpcidem: %s: %q is not a full method name (/package.Service/Method)", option, n))
		}
		set[n] = true
	}
	return set
}
