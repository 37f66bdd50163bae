package idem

import (
	"encoding/hex"
	"sync"
	"testing"
)

// TestOwnersUnique draws owner tokens from several goroutines at once,
// across many batches of random bytes: each is ownerLen hex digits and no
// two are equal.
func TestOwnersUnique(t *testing.T) {
	const goroutines, each = 4, 5000
	var mu sync.Mutex
	seen := make(map[string]bool, goroutines*each)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			owners := make([]string, each)
			for i := range owners {
				owners[i] = string(appendOwner(nil))
			}
			mu.Lock()
			defer mu.Unlock()
			for _, o := range owners {
				if _, err := hex.DecodeString(o); err != nil || len(o) != ownerLen {
					t.Errorf("owner %q: not %d hex digits", o, ownerLen)
				}
				if seen[o] {
					t.Errorf("owner %q drawn twice", o)
				}
				seen[o] = true
			}
		})
	}
	wg.Wait()
}
