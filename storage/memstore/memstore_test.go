package memstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/storagetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newStore(t *testing.T, opts ...Option) (*Store, *clock) {
	clk := &clock{now: time.Unix(1_700_000_000, 0)}
	s := New(append([]Option{WithClock(clk.Now)}, opts...)...)
	t.Cleanup(func() { s.Close() })
	return s, clk
}

func TestContract(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		s, clk := newStore(t)
		return storagetest.Harness{Store: s, Advance: clk.Advance}
	})
}

var ctx = context.Background()

func TestBoundNeverEvictsInFlight(t *testing.T) {
	s, clk := newStore(t, WithMaxEntries(3))
	for i := range 3 {
		if _, err := s.Acquire(ctx, fmt.Sprint("p", i), "o", "", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.Acquire(ctx, "p3", "o", "", time.Minute)
	if !errors.Is(err, storage.ErrFull) {
		t.Fatalf("Acquire on a store full of requests in flight: %v, want ErrFull", err)
	}
	for i := range 3 {
		if res, _ := s.Acquire(ctx, fmt.Sprint("p", i), "other", "", time.Minute); res.State != storage.InFlight {
			t.Fatalf("p%d was evicted while in flight: %v", i, res.State)
		}
	}
	clk.Advance(2 * time.Minute) // the leases ran out: those entries may go
	if res, err := s.Acquire(ctx, "p3", "o", "", time.Minute); err != nil || res.State != storage.Acquired {
		t.Fatalf("after the leases expired: %v, %v", res.State, err)
	}
	if s.Len() > 3 {
		t.Fatalf("Len %d over the bound", s.Len())
	}
}

func TestBoundEvictsOldestDone(t *testing.T) {
	s, _ := newStore(t, WithMaxEntries(3))
	for _, k := range []string{"d1", "d2"} {
		s.Acquire(ctx, k, "o", "", time.Minute)
		s.Complete(ctx, k, "o", []byte(k), time.Hour)
	}
	s.Acquire(ctx, "p", "o", "", time.Minute)
	s.Acquire(ctx, "new1", "o", "", time.Minute) // evicts d1
	if res, _ := s.Acquire(ctx, "d2", "x", "", time.Minute); res.State != storage.Done {
		t.Fatalf("d2 evicted before d1: %v", res.State)
	}
	if res, _ := s.Acquire(ctx, "p", "x", "", time.Minute); res.State != storage.InFlight {
		t.Fatalf("in-flight entry evicted: %v", res.State)
	}
	if s.Len() != 3 {
		t.Fatalf("Len %d", s.Len())
	}
	// d1 is gone, so it is new: making room evicts d2, the last done entry.
	if res, err := s.Acquire(ctx, "d1", "x", "", time.Minute); err != nil || res.State != storage.Acquired {
		t.Fatalf("re-acquiring the evicted d1: %v, %v", res.State, err)
	}
	if _, err := s.Acquire(ctx, "one-more", "x", "", time.Minute); !errors.Is(err, storage.ErrFull) {
		t.Fatalf("only entries in flight remain, want ErrFull, got %v", err)
	}
}

func TestSweepAndBytes(t *testing.T) {
	s, clk := newStore(t)
	s.Acquire(ctx, "a", "owner", "fp", time.Minute)
	s.Acquire(ctx, "b", "owner", "fp", time.Hour)
	s.Complete(ctx, "b", "owner", []byte("0123456789"), time.Hour)
	if got, want := s.Bytes(), len("a")+len("fp")+len("owner")+len("b")+len("fp")+10; got != want {
		t.Fatalf("Bytes %d, want %d", got, want)
	}
	clk.Advance(2 * time.Minute)
	s.sweep()
	if s.Len() != 1 || s.Bytes() != len("b")+len("fp")+10 {
		t.Fatalf("after sweep: Len %d Bytes %d", s.Len(), s.Bytes())
	}
	clk.Advance(2 * time.Hour)
	s.sweep()
	if s.Len() != 0 || s.Bytes() != 0 {
		t.Fatalf("after the TTL: Len %d Bytes %d", s.Len(), s.Bytes())
	}
}

func TestJanitorRunsAndCloseStopsIt(t *testing.T) {
	clk := &clock{now: time.Unix(0, 0)}
	s := New(WithClock(clk.Now), WithCleanupInterval(time.Millisecond))
	s.Acquire(ctx, "a", "o", "", time.Minute)
	clk.Advance(time.Hour)
	deadline := time.Now().Add(5 * time.Second)
	for s.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the janitor did not remove the expired entry")
		}
		time.Sleep(time.Millisecond) // waiting for the janitor's ticker, the thing under test
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); s.Close() }()
	}
	wg.Wait()
	s.Close()
	// goleak in TestMain fails the package if the janitor still runs.
}

func TestAcquireAllocations(t *testing.T) {
	s, _ := newStore(t)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
	}
	i := 0
	allocs := testing.AllocsPerRun(500, func() {
		s.Acquire(ctx, keys[i], "owner", "fp", time.Minute)
		i++
	})
	if allocs > 1.5 { // the entry, plus amortised map growth
		t.Fatalf("Acquire of a new key allocates %.1f times", allocs)
	}
}
