package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
)

// outageStore fails every Extend sent between from and to (on the clock of
// the test's bubble), as a store that cannot be reached, and records the
// context values Extend was given.
type outageStore struct {
	storage.Store
	from, to time.Time
	failed   atomic.Int64
	traced   atomic.Int64 // Extends whose ctx carried traceKey
}

type traceKey struct{}

func (s *outageStore) Extend(ctx context.Context, key, owner string, lease time.Duration) error {
	if ctx.Value(traceKey{}) != nil {
		s.traced.Add(1)
	}
	if now := time.Now(); !now.Before(s.from) && now.Before(s.to) {
		s.failed.Add(1)
		return errors.New("dial tcp: connection refused")
	}
	return s.Store.Extend(ctx, key, owner, lease)
}

// A store outage shorter than two thirds of the lease, beginning just
// before, at or after a renewal falls due, never costs a second
// execution: the failed renewal is tried again soon, not a period later.
// On the main before this fix a renewal failed at 1 s was tried again at
// 2 s and 3 s, when the 3 s lease had run out: a duplicate at 4 s ran the
// function a second time (and the first was reported lease-lost).
func TestRenewalRetriedThroughAnOutage(t *testing.T) {
	const lease = 3 * time.Second
	for _, from := range []time.Duration{lease/3 - time.Millisecond, lease / 3, lease / 2, lease/3 + lease/3 - time.Millisecond} {
		t.Run(fmt.Sprint("outage from ", from), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memstore.New()
				defer mem.Close()
				start := time.Now()
				store := &outageStore{Store: mem, from: start.Add(from), to: start.Add(from + 2*lease/3 - 20*time.Millisecond)}
				var log eventLog
				m, err := idem.New(store, idem.WithLease(lease), idem.WithObserver(log.observe))
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.WithValue(context.Background(), traceKey{}, "span")
				var runs atomic.Int32
				proceed := make(chan struct{})
				release := sync.OnceFunc(func() { close(proceed) })
				defer release()
				fn := func(context.Context) ([]byte, error) {
					if runs.Add(1) == 1 {
						<-proceed
					}
					return []byte("paid"), nil
				}
				first := make(chan error, 1)
				go func() {
					_, err := m.Do(ctx, "pay", "p-1", fn)
					first <- err
				}()
				// Past the outage and a whole lease after it began: the lease
				// is still held, so a duplicate is refused.
				time.Sleep(from + lease)
				if _, err := m.Do(context.Background(), "pay", "p-1", fn); !errors.Is(err, idem.ErrConflict) {
					t.Fatalf("duplicate after the outage: %v, want ErrConflict (the lease was lost)", err)
				}
				release()
				if err := <-first; err != nil {
					t.Fatal(err)
				}
				if got, err := m.Do(context.Background(), "pay", "p-1", fn); err != nil || string(got) != "paid" {
					t.Fatalf("retry: %q %v", got, err)
				}
				if n := runs.Load(); n != 1 {
					t.Fatalf("function ran %d times, want 1", n)
				}
				if store.failed.Load() < 2 {
					t.Fatalf("%d renewals failed in the outage: the test did not test", store.failed.Load())
				}
				if store.traced.Load() == 0 {
					t.Fatal("no Extend carried the context values of Do's ctx")
				}
				if got := log.outcomes(); len(got) != 3 || got[0] != idem.Conflict || got[1] != idem.Executed || got[2] != idem.Replayed {
					t.Fatalf("events %v, want conflict, executed, replayed", got)
				}
			})
		})
	}
}

// An outage longer than the lease loses it: the renewals stop once the
// lease has run out since the last success (no endless tries), and the
// execution is reported lease-lost.
func TestRenewalGivesUpWithTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 3 * time.Second
		mem := memstore.New()
		defer mem.Close()
		start := time.Now()
		store := &outageStore{Store: mem, from: start, to: start.Add(time.Hour)}
		var log eventLog
		m, err := idem.New(store, idem.WithLease(lease), idem.WithObserver(log.observe))
		if err != nil {
			t.Fatal(err)
		}
		proceed := make(chan struct{})
		release := sync.OnceFunc(func() { close(proceed) })
		defer release()
		done := make(chan error, 1)
		go func() {
			_, err := m.Do(context.Background(), "pay", "p-1", func(context.Context) ([]byte, error) {
				<-proceed
				return []byte("paid"), nil
			})
			done <- err
		}()
		time.Sleep(2 * lease)
		synctest.Wait()
		tries := store.failed.Load()
		time.Sleep(2 * lease)
		synctest.Wait()
		if more := store.failed.Load() - tries; more != 0 || tries > 60 {
			t.Fatalf("%d renewals in the first two leases, %d after the lease ran out", tries, more)
		}
		release()
		<-done
		if got := log.outcomes(); len(got) != 1 || got[0] != idem.LeaseLost {
			t.Fatalf("events %v, want lease-lost", got)
		}
	})
}
