package storagetest_test

import (
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/storagetest"
)

// A store's own test runs the contract suite on it: here the memory store,
// with a clock the suite moves, so that the expiry clauses take no time.
// (A suite needs a *testing.T, so this example is compiled, not run: the
// memory store's tests run the suite.)
func ExampleRun() {
	_ = func(t *testing.T) { // func TestContract(t *testing.T), in the store's package
		storagetest.Run(t, func(t *testing.T) storagetest.Harness {
			var mu sync.Mutex
			now := time.Unix(1_700_000_000, 0)
			s := memstore.New(memstore.WithClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now }))
			t.Cleanup(func() { s.Close() })
			return storagetest.Harness{Store: s, Advance: func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }}
		})
	}
}
