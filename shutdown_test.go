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

// Shutdown waits for a record that the store could not take at first: the
// background retry stores it before Shutdown returns, so the retry after
// the deploy is replayed instead of running the handler again.
func TestShutdownWaitsForTheRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New()
		defer mem.Close()
		var down atomic.Bool
		down.Store(true)
		store := &hookStore{Store: mem, complete: func(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
			if down.Load() {
				return errOOM
			}
			return mem.Complete(ctx, key, owner, rec, ttl)
		}}
		m, err := idem.New(store)
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int64
		h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(201)
		}))
		serve(h, "k", "")
		done := make(chan error, 1)
		go func() { done <- m.Shutdown(context.Background()) }()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("Shutdown returned %v while a record was still unstored", err)
		default:
		}
		down.Store(false)
		if err := <-done; err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if w := serve(h, "k", ""); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
			t.Fatalf("retry after Shutdown: %d replayed %q, handler ran %d times", w.Code, w.Header().Get("Idempotent-Replayed"), runs.Load())
		}
		if err := m.Shutdown(context.Background()); err != nil {
			t.Fatalf("second Shutdown: %v", err)
		}
	})
}

// Shutdown waits for a handler still running, and tells when its context
// ends first.
func TestShutdownDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New()
		defer mem.Close()
		m, err := idem.New(mem)
		if err != nil {
			t.Fatal(err)
		}
		entered, proceed := make(chan struct{}), make(chan struct{})
		h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-proceed
			w.WriteHeader(201)
		}))
		served := make(chan struct{})
		go func() { defer close(served); serve(h, "k", "") }()
		<-entered
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err = m.Shutdown(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "1 executions not finished") {
			t.Fatalf("Shutdown with a handler running: %v", err)
		}
		close(proceed)
		<-served
		if err := m.Shutdown(context.Background()); err != nil {
			t.Fatalf("Shutdown once the handler returned: %v", err)
		}
	})
}

// Shutdown with nothing left returns nil even when its context has ended
// already. On the main before this fix it returned the context's error
// about half the time (select picks at random among ready cases).
func TestShutdownNothingLeftEndedContext(t *testing.T) {
	mem, _ := newMemStore(t)
	m, err := idem.New(mem)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 200 {
		if err := m.Shutdown(ctx); err != nil {
			t.Fatalf("call %d: %v, want nil: nothing was left", i, err)
		}
	}
}
