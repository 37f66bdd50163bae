package memstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/storage/memstore"
)

// The store on its own, as the middleware drives it, on a clock the example
// moves: a record is kept for its TTL and then forgotten, so the key can be
// used afresh.
func Example() {
	var now atomic.Int64 // the clock, read by the store and its janitor
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	s := memstore.New(memstore.WithClock(clock), memstore.WithMaxEntries(10_000))
	defer s.Close() // stops the janitor goroutine
	ctx := context.Background()

	res, _ := s.Acquire(ctx, "key", "owner-1", "fp", 30*time.Second)
	fmt.Println("first:", res.State)
	res, _ = s.Acquire(ctx, "key", "owner-2", "fp", 30*time.Second)
	fmt.Println("duplicate:", res.State, res.LeaseLeft)

	_ = s.Complete(ctx, "key", "owner-1", []byte("encoded response"), time.Hour)
	res, _ = s.Acquire(ctx, "key", "owner-3", "fp", 30*time.Second)
	fmt.Printf("retry: %s %q\n", res.State, res.Record)

	now.Add(int64(time.Hour))
	res, _ = s.Acquire(ctx, "key", "owner-4", "fp", 30*time.Second)
	fmt.Println("after the TTL:", res.State)
	// Output:
	// first: acquired
	// duplicate: in flight 30s
	// retry: done "encoded response"
	// after the TTL: acquired
}
