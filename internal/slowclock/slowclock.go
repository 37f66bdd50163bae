// Package slowclock helps tests whose verdict needs a step to come within
// some time of an earlier one on a real clock, which a loaded machine may
// stretch: [Store] tells a short lease that ran out because its renewals
// came late from a broken renewal, [InTime] runs such a test again with
// longer times and then skips it, and [Timed] measures how late the
// machine's timers fire while a call runs.
package slowclock

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
)

// Store wraps a store and records when the middleware's lease was taken
// (Acquire) and renewed (Extend). Set Store before use.
type Store struct {
	storage.Store
	mu   sync.Mutex
	kept []kept
}

// kept is a call that took or renewed the lease: when it was sent, and
// when it came back.
type kept struct{ sent, back time.Time }

func (l *Store) record(sent time.Time) {
	l.mu.Lock()
	l.kept = append(l.kept, kept{sent, time.Now()})
	l.mu.Unlock()
}

// Acquire is the wrapped store's, recorded when it acquired.
func (l *Store) Acquire(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
	sent := time.Now()
	res, err := l.Store.Acquire(ctx, key, owner, fp, lease)
	if err == nil && res.State == storage.Acquired {
		l.record(sent)
	}
	return res, err
}

// Extend is the wrapped store's, recorded when it succeeded.
func (l *Store) Extend(ctx context.Context, key, owner string, lease time.Duration) error {
	sent := time.Now()
	err := l.Store.Extend(ctx, key, owner, lease)
	if err == nil {
		l.record(sent)
	}
	return err
}

// Lapsed reports whether a lease of d may have run out before at, on the
// calls recorded: the store ran each between its sending and its return,
// so the lease held surely until d after the sending of the last call
// that came back in it.
func (l *Store) Lapsed(d time.Duration, at time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.kept) == 0 {
		return true
	}
	held := l.kept[0].sent.Add(d) // surely held until then
	for _, k := range l.kept[1:] {
		if !k.back.Before(held) {
			return true // perhaps too late
		}
		held = k.sent.Add(d)
	}
	return !at.Before(held)
}

// InTime runs body with d at first; body returns false when the time it
// needed to hold may have run out on a loaded machine (see Store.Lapsed):
// then again with d four times longer, twice at most, and the test is
// skipped if even that was not enough.
func InTime(t testing.TB, d time.Duration, body func(d time.Duration) bool) {
	t.Helper()
	for range 3 {
		if body(d) {
			return
		}
		t.Logf("%v may have run out on a loaded machine: trying again with %v", d, 4*d)
		d *= 4
	}
	t.Skipf("the time needed may have run out on a loaded machine, three times (the last %v): no verdict", d/4)
}

// Timed runs f and returns how long it took, and the most a timer of the
// machine fired late meanwhile: a probe sleeps 5 ms at a time and
// measures by how much each sleep overran. A bound on f's duration, on a
// real clock, holds on a loaded machine once widened by that much.
func Timed(f func()) (took, late time.Duration) {
	done := make(chan struct{})
	probed := make(chan time.Duration)
	go func() {
		var worst time.Duration
		for {
			select {
			case <-done:
				probed <- worst
				return
			default:
			}
			t0 := time.Now()
			time.Sleep(5 * time.Millisecond)
			worst = max(worst, time.Since(t0)-5*time.Millisecond)
		}
	}()
	start := time.Now()
	f()
	took = time.Since(start)
	close(done)
	return took, <-probed
}
