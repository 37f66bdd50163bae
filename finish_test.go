package idem_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/memstore"
)

// errOOM is what Redis answers a write at maxmemory with noeviction.
var errOOM = errors.New("OOM command not allowed when used memory > 'maxmemory'")

// A store that cannot write for the whole lease (Redis at maxmemory with
// noeviction answers every Complete with OOM): the background retries give
// up, and the final event carries the store's own error, not the deadline
// that cut the last attempt short. On the main before this fix it said
// "context deadline exceeded".
func TestFinishReportsTheStoresLastError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New()
		defer mem.Close()
		var attempts atomic.Int64
		store := &hookStore{Store: mem, complete: func(ctx context.Context, _, _ string, _ []byte, _ time.Duration) error {
			attempts.Add(1)
			// Redis answers at once while there is time; an attempt that
			// starts near the deadline is cut short by the context.
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) < 50*time.Millisecond {
				<-ctx.Done()
				return ctx.Err()
			}
			return errOOM
		}}
		events := make(chan idem.Event, 1)
		m, err := idem.New(store, idem.WithLease(time.Second), idem.WithObserver(func(ev idem.Event) { events <- ev }))
		if err != nil {
			t.Fatal(err)
		}
		h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }))
		if w := serve(h, "k", ""); w.Code != 201 {
			t.Fatalf("status %d", w.Code)
		}
		ev := <-events
		if ev.Outcome != idem.StoreError || !errors.Is(ev.Err, errOOM) {
			t.Fatalf("final event %v %v, want store-error with the store's OOM error", ev.Outcome, ev.Err)
		}
		if errors.Is(ev.Err, context.DeadlineExceeded) {
			t.Fatalf("final event %v: the deadline hides the store's error", ev.Err)
		}
		if attempts.Load() < 3 {
			t.Fatalf("%d attempts: the last one was not cut short by the deadline", attempts.Load())
		}
	})
}

// A panic ends through the same path as a return: the release that fails
// is retried in the background like a complete, so the key is freed for a
// retry; the event says released and keeps the panic value. On the main
// before this fix the failed release was not retried (the retry got 409
// until the lease ran out) and the event held the panic as text only.
func TestPanicReleaseRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New()
		defer mem.Close()
		var failures atomic.Int64
		failures.Store(2)
		store := &hookStore{Store: mem, release: func(ctx context.Context, key, owner string) error {
			if failures.Add(-1) >= 0 {
				return errOOM
			}
			return mem.Release(ctx, key, owner)
		}}
		events := make(chan idem.Event, 2)
		m, err := idem.New(store, idem.WithObserver(func(ev idem.Event) { events <- ev }))
		if err != nil {
			t.Fatal(err)
		}
		boom := errors.New("boom")
		var runs atomic.Int64
		h := recoverer(nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if runs.Add(1) == 1 {
				panic(boom)
			}
			w.WriteHeader(201)
		})))
		if w := serve(h, "k", ""); w.Code != 500 {
			t.Fatalf("panicking handler: %d", w.Code)
		}
		ev := <-events
		var pe *idem.PanicError
		if ev.Outcome != idem.Released || !errors.As(ev.Err, &pe) || pe.Value != boom || !errors.Is(ev.Err, boom) {
			t.Fatalf("event %v %v, want released with the panic value", ev.Outcome, ev.Err)
		}
		if w := serve(h, "k", ""); w.Code != 201 || runs.Load() != 2 {
			t.Fatalf("retry after the panic: %d, handler ran %d times", w.Code, runs.Load())
		}
	})
}

// recoverer answers 500 to a panic, as an application's recovery
// middleware outside idem's would.
func recoverer(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				w.WriteHeader(http.StatusInternalServerError)
			}
		}()
		h.ServeHTTP(w, r)
	})
}
