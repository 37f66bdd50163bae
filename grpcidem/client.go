package grpcidem

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	mathrand "math/rand/v2"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Reasons for which the client interceptor made no further attempt,
// although the last one called for a retry: [Attempt].Stop wraps one.
var (
	// ErrAttemptsExhausted: WithMaxAttempts attempts were made.
	ErrAttemptsExhausted = errors.New("grpcidem: attempts exhausted")
	// ErrTimeExhausted: the wait before the next attempt would end after
	// WithMaxElapsed from the first attempt, or at or after the context's
	// deadline.
	ErrTimeExhausted = errors.New("grpcidem: retry time exhausted")
)

// maxServerDelay caps a delay the server asks for before it is waited:
// far above any sensible WithMaxElapsed, far below an overflow.
const maxServerDelay = 24 * time.Hour

// Attempt is the outcome of one attempt of a protected call, given to the
// WithAttemptHook function. It never holds the idempotency key.
type Attempt struct {
	// Context is the call's context as the caller gave it (without the
	// key the interceptor added), for the trace and request ids it holds.
	Context context.Context
	// Method is the call's full method name, "/package.Service/Method".
	Method string
	// N is the number of the attempt, 1 for the first.
	N int
	// Code is the attempt's status code, OK when it succeeded; Err is its
	// error, nil when it succeeded.
	Code codes.Code
	Err  error
	// Header and Trailer are the metadata the attempt received (nil when
	// it reached no server). The hook must not modify them.
	Header, Trailer metadata.MD
	// Replayed is true when the header carries idempotent-replayed: true:
	// the server did not run the call for this answer but sent the one it
	// kept from its first run.
	Replayed bool
	// Duration runs from the start of the attempt to its end.
	Duration time.Duration
	// Retry is true when another attempt follows, after Wait.
	Retry bool
	// Wait is how long the interceptor waits before the next attempt, when
	// Retry is true: the server's delay plus up to a tenth of it, or the
	// backoff.
	Wait time.Duration
	// Stop is set when the outcome called for a retry that will not be
	// made: it wraps ErrAttemptsExhausted or ErrTimeExhausted. Nil when the
	// outcome is final or Retry is true.
	Stop error
}

// NewKey returns a new random key: 128 bits from crypto/rand, in unpadded
// base64url (22 characters). It is what the client interceptor gives a
// call without a key; call it yourself to store a key with an operation
// before sending it, so that a retry after a restart of your process
// carries the same key (put it in the call's outgoing metadata).
func NewKey() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand crashes the program instead)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// UnaryClientInterceptor returns the interceptor that gives each unary
// call one idempotency key and retries it with that key, by the rules of
// the kit's HTTP client (idemclient): see the package documentation. Use
// it with grpc.WithChainUnaryInterceptor (or grpc.WithUnaryInterceptor).
// It panics on an invalid option.
//
// A call whose outgoing metadata already carries the key keeps it (a key
// saved with a job, so that a restart resends the same one); any other
// gets a new one ([NewKey]). It retries Unavailable, idem's in-flight
// Aborted (the ErrorInfo of [ReasonInFlight] in [Domain], never an
// application's own Aborted) and, with [WithPerAttemptTimeout], an
// attempt that ran out of its own deadline. The call returns its last
// attempt's answer: the response, or its status error as the server or
// the connection gave it. The key is never logged nor put in an error.
func UnaryClientInterceptor(opts ...ClientOption) grpc.UnaryClientInterceptor {
	cfg := defaultClientConfig()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if cfg.methods != nil && !cfg.methods[method] {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		caller := ctx // without the key, for the hook
		if len(metadata.ValueFromOutgoingContext(ctx, cfg.header)) == 0 {
			ctx = metadata.AppendToOutgoingContext(ctx, cfg.header, NewKey())
		}
		var header, trailer metadata.MD
		all := make([]grpc.CallOption, len(callOpts), len(callOpts)+2)
		copy(all, callOpts)
		all = append(all, grpc.Header(&header), grpc.Trailer(&trailer))

		start := time.Now()
		deadline, hasDeadline := ctx.Deadline()
		for n := 1; ; n++ {
			header, trailer = nil, nil
			began := time.Now()
			timedOut, err := cfg.attempt(ctx, method, req, reply, cc, invoker, all)
			ended := time.Now()
			code := status.Code(err)
			replayed := isReplayed(header)
			retry := !replayed && ctx.Err() == nil &&
				(code == codes.Unavailable || code == codes.Aborted && Reason(err) == ReasonInFlight || timedOut)
			var (
				wait time.Duration
				stop error
			)
			if retry {
				wait = cfg.wait(n, serverDelay(err, header, trailer))
				at := ended.Add(wait)
				switch {
				case n >= cfg.maxAttempts:
					stop = ErrAttemptsExhausted
				case cfg.maxElapsed > 0 && at.Sub(start) > cfg.maxElapsed, hasDeadline && !at.Before(deadline):
					stop = ErrTimeExhausted
				}
				if stop != nil {
					wait = 0
				}
			}
			if cfg.hook != nil {
				cfg.hook(Attempt{
					Context: caller, Method: method, N: n, Code: code, Err: err,
					Header: header, Trailer: trailer, Replayed: replayed, Duration: ended.Sub(began),
					Retry: retry && stop == nil, Wait: wait, Stop: stop,
				})
			}
			// A timer may fire late, past the deadline, before the
			// context's own timer has ended it: no attempt starts then.
			if !retry || stop != nil || !sleep(ctx, wait) || hasDeadline && !time.Now().Before(deadline) {
				return err
			}
		}
	}
}

// attempt makes one attempt, under the per-attempt timeout when there is
// one: timedOut reports that the attempt ended DeadlineExceeded because
// its own deadline passed, not the call's.
func (c *clientConfig) attempt(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) (timedOut bool, err error) {
	if c.perAttempt <= 0 {
		return false, invoker(ctx, method, req, reply, cc, opts...)
	}
	actx, cancel := context.WithTimeout(ctx, c.perAttempt)
	defer cancel()
	err = invoker(actx, method, req, reply, cc, opts...)
	timedOut = status.Code(err) == codes.DeadlineExceeded && errors.Is(actx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
	return timedOut, err
}

// isReplayed reports whether header marks a replay.
func isReplayed(header metadata.MD) bool {
	vs := header[ReplayedHeader]
	return len(vs) > 0 && vs[0] == "true"
}

// serverDelay returns the delay the server asked for: its status's
// google.rpc.RetryInfo, else its retry-after metadata (whole seconds, in
// the header or the trailer); 0 when it gave none.
func serverDelay(err error, header, trailer metadata.MD) time.Duration {
	if st, ok := status.FromError(err); ok && len(st.Proto().GetDetails()) > 0 {
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().IsValid() {
				if d := ri.GetRetryDelay().AsDuration(); d > 0 {
					return min(d, maxServerDelay)
				}
			}
		}
	}
	for _, md := range [2]metadata.MD{header, trailer} {
		if vs := md[RetryAfterHeader]; len(vs) > 0 {
			s, err := strconv.ParseUint(vs[0], 10, 64)
			if err != nil && !errors.Is(err, strconv.ErrRange) {
				continue
			}
			if err != nil || s > uint64(maxServerDelay/time.Second) {
				return maxServerDelay
			}
			return time.Duration(s) * time.Second
		}
	}
	return 0
}

// wait returns how long to wait after attempt n: the server's delay plus
// up to a tenth of it (so that the clients told the same moment do not
// all come back at once), or the backoff with full jitter.
func (c *clientConfig) wait(n int, delay time.Duration) time.Duration {
	if delay > 0 {
		return delay + jitter(delay/10)
	}
	ceil := c.backoffMax
	if shift := n - 1; shift < 62 {
		if b := c.backoffBase << shift; b > 0 && b>>shift == c.backoffBase {
			ceil = min(ceil, b)
		}
	}
	return jitter(ceil)
}

// jitter returns a random duration in [0, d].
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return mathrand.N(d + 1)
}

// sleep waits for d and reports whether it did: false when ctx ended
// first.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return ctx.Err() == nil // select picks at random when both are ready
	case <-ctx.Done():
		return false
	}
}
