package memstore_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/storage"
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

// A queue consumer deduplicates redelivered messages with any
// storage.Store (a redisstore.Store when several consumers share the
// queue): the message id is the key, the lease covers the processing, and
// the stored record marks the message as handled.
func Example_queueConsumer() {
	s := memstore.New()
	defer s.Close()
	ctx := context.Background()

	handle := func(msgID, body string) {
		owner := rand.Text() // a new token for each attempt
		res, err := s.Acquire(ctx, "msg:"+msgID, owner, "", time.Minute)
		switch {
		case err != nil:
			fmt.Println(msgID, "store down: nack, redeliver later")
		case res.State == storage.Done:
			fmt.Println(msgID, "duplicate: ack without processing")
		case res.State == storage.InFlight:
			fmt.Println(msgID, "being processed elsewhere: nack")
		default:
			fmt.Println(msgID, "processing", body)
			// On failure: s.Release(ctx, "msg:"+msgID, owner), then nack.
			_ = s.Complete(ctx, "msg:"+msgID, owner, []byte("ok"), 24*time.Hour)
		}
	}
	handle("m-1", "charge 100")
	handle("m-1", "charge 100") // redelivered
	handle("m-2", "charge 50")
	// Output:
	// m-1 processing charge 100
	// m-1 duplicate: ack without processing
	// m-2 processing charge 50
}

// An operator's view of a store (storage.Inspector, which every store of
// the module implements): which executions have been in flight for more
// than a minute, what one key holds, and removing a stuck entry so that
// the next request runs afresh.
func ExampleStore_List() {
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	s := memstore.New(memstore.WithClock(func() time.Time { return time.Unix(0, now.Load()) }))
	defer s.Close()
	ctx := context.Background()
	_, _ = s.Acquire(ctx, "stuck", "owner-1", "fp", 10*time.Minute)
	now.Add(int64(2 * time.Minute))
	_, _ = s.Acquire(ctx, "fresh", "owner-2", "fp", 10*time.Minute)
	_, _ = s.Acquire(ctx, "done", "owner-3", "fp", time.Minute)
	_ = s.Complete(ctx, "done", "owner-3", []byte("encoded response"), time.Hour)

	var i storage.Inspector = s
	page, _ := i.List(ctx, storage.Query{State: storage.InFlight, MinAge: time.Minute})
	for _, e := range page.Entries {
		fmt.Printf("%s: %s for %v, lease left %v\n", e.Key, e.State, time.Unix(0, now.Load()).Sub(e.Since), e.LeaseLeft)
	}
	e, _ := i.Lookup(ctx, "done", false)
	fmt.Printf("done: %s, %d bytes, expires in %v\n", e.State, e.Size, e.Expires.Sub(time.Unix(0, now.Load())))

	// Remove takes the version the listing showed: it removes the entry
	// only if it is still that one (still in flight, under owner-1).
	stuck := page.Entries[0]
	_ = s.Complete(ctx, "stuck", "owner-1", []byte("late but done"), time.Hour)
	_, err := i.Remove(ctx, "stuck", stuck.Version)
	fmt.Println("completed meanwhile:", errors.Is(err, storage.ErrChanged))

	_, _ = s.Acquire(ctx, "stuck-2", "owner-5", "fp", 10*time.Minute)
	shown, _ := i.Lookup(ctx, "stuck-2", false)
	removed, _ := i.Remove(ctx, "stuck-2", shown.Version)
	res, _ := s.Acquire(ctx, "stuck-2", "owner-6", "fp", 10*time.Minute)
	fmt.Println("removed:", removed.State, "then:", res.State)
	// Output:
	// stuck: in flight for 2m0s, lease left 8m0s
	// done: done, 16 bytes, expires in 1h0m0s
	// completed meanwhile: true
	// removed: in flight then: acquired
}
