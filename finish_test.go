package idem_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
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

// Once any of the response has gone to the client, the execution is done
// and never released: a reverse proxy that panics with
// http.ErrAbortHandler after sending the upstream's 201 (its client went
// away mid-body) leaves a done, not replayable key, and the retry gets 409
// instead of a second upstream call. A panic before anything was sent
// still releases. On the main before this fix the panic path released the
// key and the retry ran the handler again.
func TestSentResponseNeverReleased(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(w http.ResponseWriter)
		kept  bool
	}{
		{"status and body sent", func(w http.ResponseWriter) { w.WriteHeader(201); w.Write([]byte("part")) }, true},
		{"status flushed", func(w http.ResponseWriter) { w.WriteHeader(201); w.(http.Flusher).Flush() }, true},
		{"status held back", func(w http.ResponseWriter) { w.WriteHeader(201) }, false},
		{"nothing written", func(w http.ResponseWriter) {}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem, _ := newMemStore(t)
			var log eventLog
			m, err := idem.New(mem, idem.WithObserver(log.observe))
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int64
			h := recoverer(nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					tc.write(w)
					panic(http.ErrAbortHandler)
				}
				w.WriteHeader(201)
			})))
			serve(h, "k", "")
			w := serve(h, "k", "")
			if !tc.kept {
				if w.Code != 201 || runs.Load() != 2 {
					t.Fatalf("retry after a panic that sent nothing: %d, handler ran %d times, want 201 and 2", w.Code, runs.Load())
				}
				return
			}
			if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "not stored") || runs.Load() != 1 {
				t.Fatalf("retry after a panic that sent the response: %d %s, handler ran %d times; want 409 not replayable, 1 run",
					w.Code, w.Body, runs.Load())
			}
			ev := log.ev[0]
			if ev.Outcome != idem.NotReplayable || !errors.Is(ev.Err, http.ErrAbortHandler) || ev.Status != 201 {
				t.Fatalf("event %v %d %v, want not-replayable 201 with the panic", ev.Outcome, ev.Status, ev.Err)
			}
		})
	}
}

// MarkDone keeps a 5xx answer (which would release the key) as done, not
// replayable: a proxy whose upstream timed out after the request was sent
// answers 502 and marks it, and the retry gets 409, not a second upstream
// call. A marked 201 is stored and replayed as usual; outside a protected
// request MarkDone reports false.
func TestMarkDone(t *testing.T) {
	mem, _ := newMemStore(t)
	var log eventLog
	m, err := idem.New(mem, idem.WithObserver(log.observe))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	marked := make(chan bool, 8)
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		marked <- idem.MarkDone(r.Context())
		if r.Header.Get("Idempotency-Key") == "ok" {
			w.WriteHeader(201)
			return
		}
		w.WriteHeader(http.StatusBadGateway)
	}))
	if w := serve(h, "k", ""); w.Code != http.StatusBadGateway || !<-marked {
		t.Fatalf("first: %d", w.Code)
	}
	if w := serve(h, "k", ""); w.Code != http.StatusConflict || runs.Load() != 1 {
		t.Fatalf("retry of a marked 502: %d %s, handler ran %d times", w.Code, w.Body, runs.Load())
	}
	if w := serve(h, "ok", ""); w.Code != 201 || !<-marked {
		t.Fatalf("marked 201: %d", w.Code)
	}
	if w := serve(h, "ok", ""); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" || runs.Load() != 2 {
		t.Fatalf("retry of a marked 201: %d %v, handler ran %d times", w.Code, w.Header(), runs.Load())
	}
	if w := serve(h, "", ""); w.Code != http.StatusBadGateway || <-marked {
		t.Fatal("MarkDone reported true for a request without a key")
	}
	if idem.MarkDone(context.Background()) {
		t.Fatal("MarkDone reported true outside a request")
	}
	if got := log.outcomes(); len(got) != 4 || got[0] != idem.NotReplayable || got[1] != idem.Conflict || got[2] != idem.Executed || got[3] != idem.Replayed {
		t.Fatalf("events %v", got)
	}
}

// An observer that panics on the final event of a background retry does
// not crash the process (on the main before this fix it did: the panic was
// in the middleware's own goroutine). The record is stored all the same.
func TestObserverPanicInBackgroundRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New()
		defer mem.Close()
		var failures atomic.Int64
		failures.Store(1)
		store := &hookStore{Store: mem, complete: func(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
			if failures.Add(-1) >= 0 {
				return errOOM
			}
			return mem.Complete(ctx, key, owner, rec, ttl)
		}}
		m, err := idem.New(store, idem.WithObserver(func(idem.Event) { panic("observer bug") }))
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int64
		h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(201)
		}))
		serve(h, "k", "")
		if err := m.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		func() {
			defer func() { recover() }() // the replay's event panics in this goroutine, as any observer's would
			serve(h, "k", "")
		}()
		if runs.Load() != 1 {
			t.Fatalf("handler ran %d times", runs.Load())
		}
	})
}

// An event tells how long the handler ran and how many background
// attempts the finish took; InFlight counts the execution from its lease
// to its stored result, background attempts included. (A bubble's clock:
// the handler's two seconds are exact.)
func TestEventHandlerRetriesInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New()
		defer mem.Close()
		var failures atomic.Int64
		failures.Store(2)
		store := &hookStore{Store: mem, complete: func(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
			if failures.Add(-1) >= 0 {
				return errOOM
			}
			return mem.Complete(ctx, key, owner, rec, ttl)
		}}
		events := make(chan idem.Event, 2)
		m, err := idem.New(store, idem.WithObserver(func(ev idem.Event) { events <- ev }))
		if err != nil {
			t.Fatal(err)
		}
		running := make(chan int, 1)
		h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			running <- m.InFlight()
			time.Sleep(2 * time.Second)
			w.WriteHeader(201)
		}))
		if n := m.InFlight(); n != 0 {
			t.Fatalf("InFlight before any request: %d", n)
		}
		if w := serve(h, "k", ""); w.Code != 201 {
			t.Fatalf("status %d", w.Code)
		}
		if n := <-running; n != 1 {
			t.Errorf("InFlight while the handler ran: %d, want 1", n)
		}
		if n := m.InFlight(); n != 1 {
			t.Errorf("InFlight while the result is retried in the background: %d, want 1", n)
		}
		ev := <-events
		if ev.Outcome != idem.Executed || ev.Handler != 2*time.Second || ev.Retries != 2 {
			t.Errorf("event %v, handler %v, %d retries; want executed, 2s, 2", ev.Outcome, ev.Handler, ev.Retries)
		}
		synctest.Wait()
		if n := m.InFlight(); n != 0 {
			t.Errorf("InFlight once stored: %d, want 0", n)
		}
		if w := serve(h, "k", ""); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d %v", w.Code, w.Header())
		}
		if ev := <-events; ev.Outcome != idem.Replayed || ev.Handler != 0 || ev.Retries != 0 {
			t.Errorf("replay's event %v, handler %v, %d retries; want 0 and 0", ev.Outcome, ev.Handler, ev.Retries)
		}
	})
}
