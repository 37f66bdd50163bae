package redisstore_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/idemkit/idem/storage/storagetest"
	"github.com/redis/go-redis/v9"
)

// FuzzDifferential applies the same random sequence of operations and
// clock steps to the memory store (on an injected clock) and to the Redis
// store on miniredis (FastForward), and requires the same answer from both
// at every step (see [storagetest.Differential]). Seeds:
// storagetest.DiffSeeds and testdata/fuzz/FuzzDifferential.
func FuzzDifferential(f *testing.F) {
	mr := miniredis.RunT(f)
	// No socket timeouts: miniredis runs in this process, and on a loaded
	// machine (CI, 2 shared cores, fuzz workers) it once answered later
	// than go-redis's default 3 s read timeout, a difference the fuzzer
	// reported although the stores agreed.
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1, DialerRetries: 1, ReadTimeout: -1, WriteTimeout: -1})
	f.Cleanup(func() { rdb.Close() })
	for _, seed := range storagetest.DiffSeeds {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		mr.FlushAll()
		var offset atomic.Int64 // the memory store's clock, from a fixed start
		start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		mem := memstore.New(memstore.WithClock(func() time.Time { return start.Add(time.Duration(offset.Load())) }))
		defer mem.Close()
		storagetest.Differential(t, data, storagetest.DiffHarness{
			Reference: mem,
			Store:     redisstore.New(rdb, redisstore.WithPrefix("diff:")),
			Advance: func(d time.Duration) {
				offset.Add(int64(d))
				mr.FastForward(d)
			},
		})
	})
}
