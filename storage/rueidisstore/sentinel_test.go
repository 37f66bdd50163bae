//go:build unix

package rueidisstore_test

import (
	"testing"
	"time"

	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage/rueidisstore"
	"github.com/idemkit/idem/storage/storagetest"
	"github.com/redis/rueidis"
)

// TestContractSentinel runs the contract suite through a rueidis client
// made the Sentinel way (InitAddress: the sentinels; Sentinel.MasterSet):
// a real master, and a real sentinel that names it.
func TestContractSentinel(t *testing.T) {
	master := redistest.Start(t)
	sentinel := redistest.Sentinel(t, "idem", master)
	opt := rueidisstore.ClientOption(sentinel)
	opt.Sentinel.MasterSet = "idem"
	opt.Dialer.KeepAlive, opt.ConnWriteTimeout = time.Second, 10*time.Second
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if m := c.Mode(); m != rueidis.ClientModeSentinel {
		t.Fatalf("client mode %s, want sentinel", m)
	}
	p := prefix("sentinel")
	s := rueidisstore.New(c, rueidisstore.WithPrefix(p))
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: s}
	})
	// The entries are on the master the sentinel names.
	direct := client(t, master)
	if _, err := s.Acquire(t.Context(), "on-master", "o", "fp", time.Minute); err != nil {
		t.Fatal(err)
	}
	if n, err := direct.Do(t.Context(), direct.B().Exists().Key(p+"on-master").Build()).AsInt64(); err != nil || n != 1 {
		t.Fatalf("the master holds %d entries under the key, %v; want 1", n, err)
	}
}
