package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/storage"
)

// Backoff of finishLater's attempts.
const (
	retryFirst = 25 * time.Millisecond
	retryMax   = time.Second
)

// finishLater is what happens when the store fails to take the result of
// an execution (Complete, or Release for a response that is not cached):
// the response has gone to the client, and without the record a retry
// after the lease would run the handler a second time. So the operation
// is retried in the background, with backoff, until the store accepts it,
// answers that the lease is gone (ErrNotOwner) or invalid, or one lease
// has passed: by then the entry has expired and every attempt would be
// refused. The last renewal left the entry at least two thirds of a lease,
// so a store outage shorter than that costs no second execution. The
// attempts keep the request's context values (not its cancellation), as the
// first one did. The observer hears the final result, then.
//
// op must own what it uses: the request's buffers are reused once the
// handler's request has finished.
func (x *exchange) finishLater(outcome Outcome, status int, first error, op func(context.Context) error) {
	// The goroutine takes copies, not x, which stays on the handler's
	// stack in the common case.
	obs, start := x.m.cfg.observer, x.start
	ev := Event{Method: x.r.Method, Route: x.route, Status: status}
	base := context.WithoutCancel(x.r.Context())
	deadline := time.Now().Add(x.m.cfg.lease)
	go func() {
		err := first
		delay := retryFirst
		t := time.NewTimer(time.Hour) // set before each wait
		defer t.Stop()
		for {
			left := time.Until(deadline)
			if left <= 0 {
				break
			}
			t.Reset(min(delay, left))
			<-t.C
			delay = min(2*delay, retryMax)
			ctx, cancel := context.WithDeadline(base, deadline)
			err = op(ctx)
			cancel()
			if !retryable(err) {
				break
			}
		}
		if obs != nil {
			ev.Outcome, ev.Err = finishOutcome(outcome, err)
			ev.Duration = time.Since(start)
			obs(ev)
		}
	}()
}

// retryable reports whether a store error after the handler may go away
// by itself: not a refusal of the lease nor of the arguments.
func retryable(err error) bool {
	return err != nil && !errors.Is(err, storage.ErrNotOwner) && !errors.Is(err, storage.ErrInvalid)
}

// finishOutcome is the outcome of an execution whose finish (Complete or
// Release, intended to give outcome) ended with err.
func finishOutcome(outcome Outcome, err error) (Outcome, error) {
	switch {
	case errors.Is(err, storage.ErrNotOwner):
		return LeaseLost, fmt.Errorf("%w: %w", ErrLeaseLost, err)
	case err != nil:
		return StoreError, err
	}
	return outcome, nil
}
