package idem

import (
	"context"
	"errors"
	"time"

	"github.com/idemkit/idem/storage"
)

// This file is the protocol's first step, the same for a request and for
// Do: take the lease, or learn what holds the key.

// acquire is the protocol's first step, the same for a request and for
// [Middleware.Do]: it takes the lease on skey for owner, waits while
// another execution holds it (WithWait), and says what comes next:
// Executed (run under the lease), Replayed (answer with res.Record),
// FailedOpen (the store failed: run unprotected, e says why), or any
// other outcome: refuse with e. A value under the key that is not an
// entry (storage.ErrCorrupt) is refused with ErrCorruptRecord, also
// WithFailOpen. route is the route (or operation) whose
// handler durations estimate Retry-After; issued says the key must have
// been issued (WithIssuedKeys).
func (m *Middleware) acquire(ctx context.Context, route, skey, owner, fp string, issued bool) (res storage.Result, o Outcome, e *Error) {
	err := ctx.Err() // a context that has ended is refused alike with every store
	if err == nil {
		res, err = m.take(ctx, skey, owner, fp, issued)
		if err == nil && res.State == storage.InFlight && m.cfg.wait > 0 && res.Fingerprint == fp {
			res, err = m.wait(ctx, res, skey, owner, fp, issued)
		}
		if err != nil {
			m.unlock(ctx, skey, owner, err)
		}
	}
	switch {
	case err != nil && ctx.Err() != nil:
		// The caller's own context ended (the client gave up, or a
		// deadline passed): not a store failure, and never a reason to
		// run the handler unprotected.
		return res, Canceled, newError(ErrCanceled, "The request was canceled before it could be processed; retry later.", time.Second, errors.Join(context.Cause(ctx), err))
	case errors.Is(err, storage.ErrCorrupt):
		// The store works, but the value under the key is not an entry:
		// no retry can do better, and running the handler unprotected
		// (WithFailOpen) would not be safe either.
		return res, StoreError, newError(ErrCorruptRecord, "The value stored under this idempotency key is not an idempotency record.", 0, err)
	case err != nil && m.cfg.failOpen:
		return res, FailedOpen, newError(ErrStoreUnavailable, "The idempotency store is unavailable; retry later.", time.Second, err)
	case err != nil:
		return res, StoreError, newError(ErrStoreUnavailable, "The idempotency store is unavailable; retry later.", time.Second, err)
	case res.State == storage.Acquired:
		return res, Executed, nil
	case res.State == storage.NotIssued:
		return res, Rejected, newError(ErrKeyNotIssued, "This idempotency key was not issued to this client, or it has expired; get a new one.", 0, nil)
	case res.Fingerprint != fp:
		return res, Mismatch, newError(ErrMismatch, "This idempotency key was already used with a different request.", 0, nil)
	case res.State == storage.InFlight:
		return res, Conflict, newError(ErrConflict, "A request with this idempotency key is still being processed; retry later.", m.runs.retryAfter(route, res.LeaseLeft), nil)
	case res.State == storage.Committed:
		return res, Conflict, notReplayable(0)
	}
	return res, Replayed, nil
}

// unlock releases, in the background, the lease an Acquire that failed
// with err may have taken all the same: a call that timed out, or whose
// connection broke, after the store ran it. The owner is this attempt's
// own, so the release can free nothing else; without it the key would
// stay locked for a whole lease. Refusals of the arguments, of room, or
// of a value under the key that is not an entry created nothing.
//
// The release is retried like the completions after a handler (see
// [finish.later]): with backoff while the store fails it (the failure
// that broke the Acquire often breaks the next call too), until the store
// answers (released, or nothing of this owner's is held) or the lease
// would have run out anyway: it was taken, if at all, before unlock was
// called. Shutdown waits for it and makes it try at once. It is dropped
// when the background work is at its bound (laterMax).
func (m *Middleware) unlock(ctx context.Context, skey, owner string, err error) {
	if errors.Is(err, storage.ErrInvalid) || errors.Is(err, storage.ErrFull) || errors.Is(err, storage.ErrCorrupt) || !m.pending.take(0) {
		return
	}
	base := context.WithoutCancel(ctx)
	deadline := time.Now().Add(m.cfg.lease)
	drain := m.work.add()
	go func() {
		defer m.work.done()
		defer m.pending.give(0)
		_, _ = retry(base, deadline, drain, 0, nil, func(ctx context.Context) error {
			return m.store.Release(ctx, skey, owner)
		})
	}()
}

// take is one Acquire, or AcquireIssued for a key that must have been
// issued.
func (m *Middleware) take(ctx context.Context, skey, owner, fp string, issued bool) (storage.Result, error) {
	if issued {
		return m.issuer.AcquireIssued(ctx, skey, owner, fp, m.cfg.lease)
	}
	return m.store.Acquire(ctx, skey, owner, fp, m.cfg.lease)
}

// wait polls the store until the execution in flight finishes or the wait
// ends, starting from the InFlight result res. It returns the last Acquire
// result, or ctx's error when ctx ends first.
func (m *Middleware) wait(ctx context.Context, res storage.Result, skey, owner, fp string, issued bool) (storage.Result, error) {
	deadline := time.Now().Add(m.cfg.wait)
	delay := 5 * time.Millisecond
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for res.State == storage.InFlight {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		t.Reset(min(delay, left, res.LeaseLeft))
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, 200*time.Millisecond)
		var err error
		if res, err = m.take(ctx, skey, owner, fp, issued); err != nil {
			return res, err
		}
	}
	return res, nil
}
