package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
)

// eventLog collects the observer's events.
type eventLog struct {
	mu sync.Mutex
	ev []idem.Event
}

func (l *eventLog) observe(e idem.Event) {
	l.mu.Lock()
	l.ev = append(l.ev, e)
	l.mu.Unlock()
}

func (l *eventLog) outcomes() []idem.Outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	var o []idem.Outcome
	for _, e := range l.ev {
		o = append(o, e.Outcome)
	}
	return o
}

func newDoMiddleware(t *testing.T, opts ...idem.Option) (*idem.Middleware, *eventLog) {
	t.Helper()
	mem, _ := newMemStore(t)
	var log eventLog
	m, err := idem.New(mem, append([]idem.Option{idem.WithObserver(log.observe)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return m, &log
}

// Do runs the function once per key and gives every later call its
// result, a copy the caller may change; the events name the operation.
func TestDoOnce(t *testing.T) {
	m, log := newDoMiddleware(t)
	ctx := context.Background()
	var runs atomic.Int32
	fn := func(ctx context.Context) ([]byte, error) {
		n := runs.Add(1)
		return fmt.Appendf(nil, "charged (run %d)", n), nil
	}
	first, err := m.Do(ctx, "payments", "msg-1", fn)
	if err != nil || string(first) != "charged (run 1)" {
		t.Fatalf("first: %q %v", first, err)
	}
	for range 3 {
		again, err := m.Do(ctx, "payments", "msg-1", fn)
		if err != nil || !bytes.Equal(again, first) {
			t.Fatalf("again: %q %v, want %q", again, err, first)
		}
		again[0] = 'X' // the caller's copy
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	// Another operation with the same key is another record.
	if other, err := m.Do(ctx, "emails", "msg-1", fn); err != nil || string(other) != "charged (run 2)" {
		t.Fatalf("other operation: %q %v", other, err)
	}
	want := []idem.Outcome{idem.Executed, idem.Replayed, idem.Replayed, idem.Replayed, idem.Executed}
	if got := log.outcomes(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	for _, e := range log.ev {
		if e.Method != "" || (e.Route != "payments" && e.Route != "emails") || e.Err != nil || e.Context == nil {
			t.Fatalf("event %+v", e)
		}
	}
}

// fn sees the Info of its execution; a key is checked before any store
// call.
func TestDoInfoAndKey(t *testing.T) {
	m, _ := newDoMiddleware(t, idem.WithTTL(time.Hour))
	var info idem.Info
	var lease storage.Lease
	if _, err := m.Do(context.Background(), "op", "k-1", func(ctx context.Context) ([]byte, error) {
		info, _ = idem.FromContext(ctx)
		lease, _ = storage.LeaseFromContext(ctx)
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if info.Key != "k-1" || !info.Protected || len(info.Owner) != 32 || len(info.StorageKey) != 22 {
		t.Fatalf("info %+v", info)
	}
	if lease != (storage.Lease{Key: info.StorageKey, Owner: info.Owner, TTL: time.Hour}) {
		t.Fatalf("storage lease %+v, want the Info's storage key and owner, and the TTL", lease)
	}
	for _, bad := range []string{"", strings.Repeat("k", 256), "caf\u00e9", "line\nbreak"} {
		_, err := m.Do(context.Background(), "op", bad, func(context.Context) ([]byte, error) {
			t.Fatalf("fn ran for the key %q", bad)
			return nil, nil
		})
		var e *idem.Error
		if !errors.Is(err, idem.ErrInvalidKey) || !errors.As(err, &e) || e.Status != 400 {
			t.Fatalf("key %q: %v", bad, err)
		}
	}
}

// An error from fn releases the key: Do returns it as it is, and the next
// call runs fn again. A panic releases it too and goes on.
func TestDoErrorAndPanicRelease(t *testing.T) {
	m, log := newDoMiddleware(t)
	ctx := context.Background()
	errTemporary := errors.New("smtp: try later")
	var runs atomic.Int32
	_, err := m.Do(ctx, "op", "k", func(context.Context) ([]byte, error) {
		runs.Add(1)
		return []byte("ignored"), errTemporary
	})
	if err != errTemporary {
		t.Fatalf("err %v, want fn's error as it is", err)
	}
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Fatalf("recovered %v, want the panic to go on", p)
			}
		}()
		m.Do(ctx, "op", "k", func(context.Context) ([]byte, error) {
			runs.Add(1)
			panic("boom")
		})
	}()
	res, err := m.Do(ctx, "op", "k", func(context.Context) ([]byte, error) {
		runs.Add(1)
		return []byte("sent"), nil
	})
	if err != nil || string(res) != "sent" || runs.Load() != 3 {
		t.Fatalf("third call: %q %v after %d runs", res, err, runs.Load())
	}
	want := []idem.Outcome{idem.Released, idem.Released, idem.Executed}
	if got := log.outcomes(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if !errors.Is(log.ev[0].Err, errTemporary) {
		t.Fatalf("released event's error %v", log.ev[0].Err)
	}
	var pe *idem.PanicError
	if !errors.As(log.ev[1].Err, &pe) || pe.Value != "boom" {
		t.Fatalf("panic event's error %v", log.ev[1].Err)
	}
}

// Many calls with one key while fn runs: exactly one runs it; the others
// get ErrConflict with a Retry-After, or, with WithWait, the result.
func TestDoConcurrent(t *testing.T) {
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			var opts []idem.Option
			if wait {
				opts = append(opts, idem.WithWait(time.Minute))
			}
			m, _ := newDoMiddleware(t, opts...)
			var runs atomic.Int32
			entered, proceed := make(chan struct{}), make(chan struct{})
			fn := func(context.Context) ([]byte, error) {
				runs.Add(1)
				close(entered)
				<-proceed
				return []byte("result"), nil
			}
			first := make(chan error, 1)
			go func() {
				_, err := m.Do(context.Background(), "op", "k", fn)
				first <- err
			}()
			<-entered
			const n = 32
			errs := make(chan error, n)
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					res, err := m.Do(context.Background(), "op", "k", fn)
					if err == nil && string(res) != "result" {
						err = fmt.Errorf("result %q", res)
					}
					errs <- err
				})
			}
			if !wait {
				wg.Wait()
			}
			close(proceed)
			wg.Wait()
			close(errs)
			if err := <-first; err != nil {
				t.Fatal(err)
			}
			for err := range errs {
				var e *idem.Error
				switch {
				case wait && err != nil:
					t.Fatalf("waiting call: %v", err)
				case !wait && (!errors.Is(err, idem.ErrConflict) || !errors.As(err, &e) || e.RetryAfter < time.Second):
					t.Fatalf("call while in flight: %v", err)
				}
			}
			if got := runs.Load(); got != 1 {
				t.Fatalf("fn ran %d times, want 1", got)
			}
		})
	}
}

// The store fails: ErrStoreUnavailable and fn does not run, or with
// WithFailOpen it runs unprotected.
func TestDoStoreDown(t *testing.T) {
	down := errors.New("connection refused")
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("failOpen=%v", failOpen), func(t *testing.T) {
			mem, _ := newMemStore(t)
			store := &hookStore{Store: mem, acquire: func(context.Context, string, string, string, time.Duration) (storage.Result, error) {
				return storage.Result{}, down
			}}
			var opts []idem.Option
			if failOpen {
				opts = append(opts, idem.WithFailOpen())
			}
			m, err := idem.New(store, opts...)
			if err != nil {
				t.Fatal(err)
			}
			ran := false
			res, err := m.Do(context.Background(), "op", "k", func(ctx context.Context) ([]byte, error) {
				info, _ := idem.FromContext(ctx)
				ran = !info.Protected && info.Key == "k"
				return []byte("unprotected"), nil
			})
			if failOpen {
				if err != nil || string(res) != "unprotected" || !ran {
					t.Fatalf("fail-open: %q %v, ran unprotected %v", res, err, ran)
				}
				return
			}
			if !errors.Is(err, idem.ErrStoreUnavailable) || !errors.Is(err, down) || ran {
				t.Fatalf("store down: %v, ran %v", err, ran)
			}
		})
	}
}

// A result larger than WithMaxResponseBody is returned but not kept: a
// later call gets ErrNotReplayable and fn does not run again.
func TestDoResultTooLarge(t *testing.T) {
	m, _ := newDoMiddleware(t, idem.WithMaxResponseBody(8))
	var runs atomic.Int32
	fn := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("0123456789"), nil }
	if res, err := m.Do(context.Background(), "op", "k", fn); err != nil || string(res) != "0123456789" {
		t.Fatalf("first: %q %v", res, err)
	}
	if _, err := m.Do(context.Background(), "op", "k", fn); !errors.Is(err, idem.ErrNotReplayable) || runs.Load() != 1 {
		t.Fatalf("again: %v after %d runs", err, runs.Load())
	}
}

// WithCallMaxResult bounds the call's stored result in place of
// WithMaxResponseBody, larger or smaller.
func TestDoCallMaxResult(t *testing.T) {
	m, _ := newDoMiddleware(t, idem.WithMaxResponseBody(8))
	for _, c := range []struct {
		key  string
		max  int
		kept bool
	}{{"larger", 16, true}, {"smaller", 4, false}, {"none", 0, false}} {
		var runs atomic.Int32
		fn := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("0123456789"), nil }
		for i := range 2 {
			res, err := m.Do(context.Background(), "op", c.key, fn, idem.WithCallMaxResult(c.max))
			switch {
			case i == 0 && (err != nil || string(res) != "0123456789"):
				t.Errorf("%s: first: %q %v", c.key, res, err)
			case i == 1 && c.kept && (err != nil || string(res) != "0123456789"):
				t.Errorf("%s: again: %q %v, want the stored result", c.key, res, err)
			case i == 1 && !c.kept && !errors.Is(err, idem.ErrNotReplayable):
				t.Errorf("%s: again: %q %v, want ErrNotReplayable", c.key, res, err)
			}
		}
		if runs.Load() != 1 {
			t.Errorf("%s: fn ran %d times", c.key, runs.Load())
		}
	}
}

// A call whose context ends while it waits for the one in flight gets
// ErrCanceled, and is not a store failure.
func TestDoCanceledWait(t *testing.T) {
	mem, _ := newMemStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	var acquires atomic.Int32
	store := &hookStore{Store: mem}
	store.acquire = func(c context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
		if acquires.Add(1) == 3 {
			cancel() // the waiting call's first poll
		}
		return mem.Acquire(c, key, owner, fp, lease)
	}
	m, err := idem.New(store, idem.WithWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	entered, proceed := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Do(context.Background(), "op", "k", func(context.Context) ([]byte, error) {
			close(entered)
			<-proceed
			return nil, nil
		})
	}()
	<-entered
	_, err = m.Do(ctx, "op", "k", func(context.Context) ([]byte, error) { t.Error("ran twice"); return nil, nil })
	close(proceed)
	<-done
	if !errors.Is(err, idem.ErrCanceled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want ErrCanceled", err)
	}
}

// fn outlives its lease many times over: the heartbeat renews it, so a
// second call gets ErrConflict, never a second run; the result is stored
// once fn returns, after a store failure by the background retry, which
// Shutdown waits for.
func TestDoLeaseAndBackgroundCompletion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New()
		defer mem.Close()
		var fails atomic.Int32
		fails.Store(2)
		store := &hookStore{Store: mem, complete: func(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
			if fails.Add(-1) >= 0 {
				return errors.New("blip")
			}
			return mem.Complete(ctx, key, owner, rec, ttl)
		}}
		m, err := idem.New(store, idem.WithLease(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		done := make(chan []byte)
		go func() {
			res, _ := m.Do(context.Background(), "op", "k", func(context.Context) ([]byte, error) {
				runs.Add(1)
				time.Sleep(10 * time.Second) // ten leases, on the bubble's clock
				return []byte("done"), nil
			})
			done <- res
		}()
		time.Sleep(9 * time.Second)
		if _, err := m.Do(context.Background(), "op", "k", nil); !errors.Is(err, idem.ErrConflict) {
			t.Fatalf("call during fn: %v", err)
		}
		if res := <-done; string(res) != "done" {
			t.Fatalf("first call: %q", res)
		}
		if err := m.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		res, err := m.Do(context.Background(), "op", "k", nil)
		if err != nil || string(res) != "done" || runs.Load() != 1 || store.extends.Load() < 9 {
			t.Fatalf("after: %q %v, %d runs, %d renewals", res, err, runs.Load(), store.extends.Load())
		}
	})
}

// The options of requests do not apply to Do: on a middleware that accepts
// issued keys only, Do takes any key. (A first version took Do's key as
// one that must have been issued, and refused it.)
func TestDoIgnoresIssuedKeys(t *testing.T) {
	m, _ := newDoMiddleware(t, idem.WithIssuedKeys(time.Hour))
	for range 2 {
		res, err := m.Do(context.Background(), "op", "msg-1", func(context.Context) ([]byte, error) { return []byte("ok"), nil })
		if err != nil || string(res) != "ok" {
			t.Fatalf("Do on a middleware WithIssuedKeys: %q %v", res, err)
		}
	}
}

// Do with a context that has already ended never runs fn and answers
// ErrCanceled, whatever the store: on the main before this fix memstore
// (which never looks at ctx) ran fn, and redisstore answered ErrCanceled.
func TestDoEndedContext(t *testing.T) {
	m, log := newDoMiddleware(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	_, err := m.Do(ctx, "pay", "p-1", func(context.Context) ([]byte, error) { ran = true; return nil, nil })
	if ran || !errors.Is(err, idem.ErrCanceled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Do on an ended context: ran %v, err %v; want not run, ErrCanceled", ran, err)
	}
	if got := log.outcomes(); len(got) != 1 || got[0] != idem.Canceled {
		t.Fatalf("events %v, want canceled", got)
	}
	// The key is free: a live call runs fn.
	if _, err := m.Do(context.Background(), "pay", "p-1", func(context.Context) ([]byte, error) { ran = true; return nil, nil }); err != nil || !ran {
		t.Fatalf("Do after: ran %v, err %v", ran, err)
	}
}

// fn that calls MarkDone and then fails keeps its key done, not
// replayable: the next delivery gets ErrNotReplayable, not a second run.
func TestDoMarkDone(t *testing.T) {
	m, _ := newDoMiddleware(t)
	var runs atomic.Int32
	boom := errors.New("reply lost")
	fn := func(ctx context.Context) ([]byte, error) {
		runs.Add(1)
		if !idem.MarkDone(ctx) {
			t.Error("MarkDone reported false inside Do")
		}
		return nil, boom
	}
	if _, err := m.Do(context.Background(), "pay", "p-1", fn); err != boom {
		t.Fatalf("first: %v, want fn's error", err)
	}
	if _, err := m.Do(context.Background(), "pay", "p-1", fn); !errors.Is(err, idem.ErrNotReplayable) || runs.Load() != 1 {
		t.Fatalf("second: %v, ran %d times; want ErrNotReplayable and 1 run", err, runs.Load())
	}
}

// TestDoCallScopeAndFingerprint: WithCallScope keeps a principal's keys
// apart (the same key runs once per scope, and a call without a scope has
// the record Do always gave); WithCallFingerprint refuses a key reused
// for other work with ErrMismatch, without running fn, and a matching
// call is replayed.
func TestDoCallScopeAndFingerprint(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	events := make(chan idem.Event, 16)
	m, err := idem.New(store, idem.WithObserver(func(ev idem.Event) { events <- ev }))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	runs := 0
	fn := func(ctx context.Context) ([]byte, error) {
		runs++
		info, _ := idem.FromContext(ctx)
		return []byte(info.StorageKey), nil
	}
	call := func(opts ...idem.CallOption) ([]byte, error) {
		t.Helper()
		return m.Do(ctx, "charges", "charge-1", fn, opts...)
	}
	alice, err := call(idem.WithCallScope("alice"), idem.WithCallFingerprint([]byte("amount=10")))
	if err != nil || runs != 1 || string(alice) != idem.OperationStorageKey("alice", "charges", "charge-1") {
		t.Fatalf("alice's first call: %q, %v, %d runs", alice, err, runs)
	}
	if b, err := call(idem.WithCallScope("alice"), idem.WithCallFingerprint([]byte("amount=10"))); err != nil || runs != 1 || string(b) != string(alice) {
		t.Fatalf("alice's retry: %q, %v, %d runs; want the replay", b, err, runs)
	}
	_, err = call(idem.WithCallScope("alice"), idem.WithCallFingerprint([]byte("amount=99")))
	var e *idem.Error
	if !errors.Is(err, idem.ErrMismatch) || !errors.As(err, &e) || runs != 1 {
		t.Fatalf("alice's key reused for other work: %v, %d runs; want ErrMismatch, not run", err, runs)
	}
	if _, err := call(idem.WithCallScope("alice")); !errors.Is(err, idem.ErrMismatch) || runs != 1 {
		t.Fatalf("alice's key without a fingerprint: %v, %d runs; want ErrMismatch", err, runs)
	}
	bob, err := call(idem.WithCallScope("bob"), idem.WithCallFingerprint([]byte("amount=99")))
	if err != nil || runs != 2 || string(bob) == string(alice) {
		t.Fatalf("bob's call with the same key: %q, %v, %d runs; want a run of its own", bob, err, runs)
	}
	plain, err := call(idem.WithCallScope(""))
	if err != nil || runs != 3 || string(plain) != idem.OperationStorageKey("", "charges", "charge-1") {
		t.Fatalf("a call without a scope: %q, %v, %d runs; want Do's usual record", plain, err, runs)
	}
	close(events)
	for ev := range events {
		if strings.Contains(fmt.Sprint(ev), "alice") || strings.Contains(fmt.Sprint(ev), "amount") {
			t.Errorf("an event shows the scope or the fingerprint: %+v", ev)
		}
	}
}
