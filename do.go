package idem

import (
	"bytes"
	"context"
	"time"

	"github.com/idemkit/idem/internal/httprec"
)

// This file is the protocol without HTTP: Do runs a function once per key,
// as a request's handler runs once per idempotency key, for work that
// arrives by other routes than a request (a queue's redeliveries, a
// scheduled job run by every instance, a provider's callback handled
// outside a handler). It takes the same steps as a request (acquire,
// execute under a renewed lease, finish), with a function's result in
// place of a response.

// Do runs fn once for key, across every process that shares the store,
// and gives its result to every later call with the same op and key for
// WithTTL. op names the operation (for example the queue or the job) and
// keeps its keys apart from every other operation's and from every
// request's; it is the Route of the observer's events, whose Method is
// empty. key is validated as an idempotency key (1 to 255 bytes of
// printable ASCII, taken as it stands: no RFC 8941 unquoting), for example
// a message id; it is hashed with op into the record's name.
//
// The call that takes the key runs fn under a lease, renewed while fn
// runs, exactly as a request's handler: fn's ctx carries the [Info] for
// FromContext (Key, Owner, Protected, StorageKey) and the storage.Lease,
// so a fence such as pgstore's works inside fn. Then:
//
//   - fn returns a result and a nil error: Do stores a copy of the result
//     and returns it as it is. A result larger than WithMaxResponseBody
//     (or the call's WithCallMaxResult) is returned but stored as not
//     replayable: later calls get ErrNotReplayable. fn must not be nil.
//   - fn returns an error: nothing is stored, the key is released (a
//     later call runs fn again) and Do returns fn's error as it is. Return
//     a nil error with a result that says what failed for a failure that
//     must not run again.
//   - fn panics (or calls runtime.Goexit): the key is released and the
//     panic goes on.
//   - fn called [MarkDone] on its ctx and then returns an error or
//     panics: the key is not released but kept as done, not replayable
//     (later calls get ErrNotReplayable), and Do returns the error (or
//     the panic goes on).
//
// A call that finds the key done gets the stored result (a copy) and a nil
// error, without running fn. Do's other errors are [*Error] values (use
// errors.Is with the package's Err values):
//
//   - ErrConflict: another call holds the key and fn still runs there
//     (after waiting for it for WithWait, when set); RetryAfter says when
//     to try again. A queue consumer leaves the message for redelivery.
//   - ErrNotReplayable: fn ran and its result was not stored (too large,
//     or the process died after a fence committed its transaction): the
//     work is done, the result is lost.
//   - ErrStoreUnavailable: the store failed; fn did not run (unless
//     WithFailOpen is set: fn then runs unprotected, with Info.Protected
//     false, and Do returns what it returns).
//   - ErrCanceled: ctx ended before the call, while the store was asked
//     or while the call waited; fn did not run. A ctx that has already
//     ended is refused before the store is asked, with every store.
//   - ErrInvalidKey: key is not a valid idempotency key. ErrCorruptRecord:
//     the stored result cannot be read.
//
// After fn returns, the result is stored on a context that ctx's
// cancellation does not stop, retried in the background when the store
// fails (see [WithLease]); [Middleware.Shutdown] waits for it. The options
// of requests (methods, header, scope, request comparison, body limits,
// cacheable statuses, rebuild, issued keys) do not apply to Do; the
// call's own options do: [WithCallScope] keeps a principal's keys apart
// (by default the principal that [ContextWithPrincipal] named in ctx),
// [WithCallFingerprint] refuses a key reused for other work (ErrMismatch).
func (m *Middleware) Do(ctx context.Context, op, key string, fn func(ctx context.Context) ([]byte, error), opts ...CallOption) ([]byte, error) {
	start := time.Now()
	if err := checkBareKey(key); err != nil {
		e := newError(ErrInvalidKey, "The idempotency key is invalid: "+err.Error()+".", 0, nil)
		m.emit(Event{Outcome: Rejected, Route: op, Duration: time.Since(start), Err: e, Context: ctx})
		return nil, e
	}
	var c callConfig
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if !c.scopeSet {
		c.scope, _ = PrincipalFromContext(ctx)
	}
	h := getHasher()
	var a [storageKeyLen + ownerLen + fingerprintLen]byte
	var b []byte
	if c.scope != "" {
		b = h.appendScopedDoKey(a[:0], c.scope, op, key)
	} else {
		b = h.appendDoKey(a[:0], op, key)
	}
	b = appendOwner(b)
	if c.fingerprinted {
		h.buf = appendFields(h.buf[:0], "call", c.fingerprint)
		b = append(b, h.sum128(nil)...)
	}
	putHasher(h)
	ids := string(b)
	skey, owner, fp := ids[:storageKeyLen], ids[storageKeyLen:storageKeyLen+ownerLen], ids[storageKeyLen+ownerLen:]

	res, o, e := m.acquire(ctx, op, skey, owner, fp, false)
	switch o {
	case Executed:
		x := &execution{finish: finish{m: m, caller: ctx, route: op, start: start, skey: skey, owner: owner}, maxResult: m.cfg.maxResp}
		if c.maxResult > 0 {
			x.maxResult = c.maxResult
		}
		x.ctx.set(ctx, Info{Key: key, Owner: owner, Protected: true, StorageKey: skey}, m.cfg.ttl)
		x.run(op, nil, fn)
		if x.err != nil {
			return nil, x.err
		}
		return x.result, nil
	case Replayed:
		var rec httprec.Record
		switch err := rec.UnmarshalBinary(res.Record); {
		case err != nil:
			e = newError(ErrCorruptRecord, "The stored result for this idempotency key cannot be read.", 0, err)
			o = StoreError
		case rec.NotReplayable:
			e, o = notReplayable(0), Conflict
		default:
			m.emit(Event{Outcome: Replayed, Route: op, Duration: time.Since(start), Context: ctx})
			return bytes.Clone(rec.Body), nil
		}
	case FailedOpen:
		m.emit(Event{Outcome: FailedOpen, Route: op, Duration: time.Since(start), Err: e, Context: ctx})
		st := new(handlerState)
		st.ctx.set(ctx, Info{Key: key}, 0)
		return fn(&st.ctx)
	}
	m.emit(Event{Outcome: o, Route: op, Duration: time.Since(start), Err: e, Context: ctx})
	return nil, e
}

// CallOption configures one call of [Middleware.Do].
type CallOption func(*callConfig)

// callConfig is what a call's options set.
type callConfig struct {
	scope, fingerprint      string
	scopeSet, fingerprinted bool
	maxResult               int // 0: WithMaxResponseBody's
}

// WithCallScope keeps the call's record apart for one principal, as a
// request's scope does (see WithScope): scope (a tenant, a user) is hashed
// with op and key into the record's name, so the same key from another
// scope is another record. The scope never appears in events or in the
// store. A call without WithCallScope is scoped by the principal that
// [ContextWithPrincipal] named in its ctx, when one is; a call with an
// empty scope, or without WithCallScope and without a principal, has the
// record that Do always gave op and key (unscoped). Do never refuses a
// call for its scope: it sees no credentials.
func WithCallScope(scope string) CallOption {
	return func(c *callConfig) { c.scope, c.scopeSet = scope, true }
}

// WithCallFingerprint makes the call say what it was asked to do, as a
// request's fingerprint does: a hash of fingerprint (any bytes, such as
// the request message, deterministically serialized) is kept with the
// entry, and a later call with the same op and key but another
// fingerprint gets ErrMismatch without running fn (nor waiting for it).
// A call without it has no fingerprint: it matches only calls without one.
func WithCallFingerprint(fingerprint []byte) CallOption {
	return func(c *callConfig) { c.fingerprint, c.fingerprinted = string(fingerprint), true }
}

// WithCallMaxResult bounds the result of the call's fn that is stored, in
// place of WithMaxResponseBody (the bound of HTTP responses): a larger
// result is returned to the caller but stored as not replayable, as
// Do's documentation says. For a transport whose answers are bounded
// otherwise (grpcidem keeps gRPC's replies up to its own WithMaxReply).
// n < 1 leaves WithMaxResponseBody's bound.
func WithCallMaxResult(n int) CallOption {
	return func(c *callConfig) { c.maxResult = max(n, 0) }
}
