package rueidisstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem/storage/rueidisstore"
	"github.com/redis/rueidis"
)

// The store on its own, as the middleware drives it: a first request takes
// the key, a duplicate finds it in flight, and after completion it finds
// the stored response. miniredis stands in for a Redis server here.
func Example() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()

	// The options recommended for a request path: fail fast while Redis
	// is unreachable.
	client, err := rueidis.NewClient(rueidisstore.ClientOption(mr.Addr()))
	if err != nil {
		panic(err)
	}
	defer client.Close()
	store := rueidisstore.New(client, rueidisstore.WithPrefix("shop:idem:"))
	ctx := context.Background()

	res, _ := store.Acquire(ctx, "key-1", "owner-a", "fingerprint", 30*time.Second)
	fmt.Println("first request:", res.State)

	res, _ = store.Acquire(ctx, "key-1", "owner-b", "fingerprint", 30*time.Second)
	fmt.Println("duplicate:", res.State, "for", res.LeaseLeft)

	if err := store.Complete(ctx, "key-1", "owner-a", []byte("201 Created"), 24*time.Hour); err != nil {
		panic(err)
	}
	res, _ = store.Acquire(ctx, "key-1", "owner-b", "fingerprint", 30*time.Second)
	fmt.Printf("retry: %v, replays %q\n", res.State, res.Record)
	fmt.Println("keys:", mr.Keys(), "TTL:", mr.TTL("shop:idem:key-1"))

	// Output:
	// first request: acquired
	// duplicate: in flight for 30s
	// retry: done, replays "201 Created"
	// keys: [shop:idem:key-1] TTL: 24h0m0s
}
