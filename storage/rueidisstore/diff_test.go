package rueidisstore_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/rueidisstore"
	"github.com/idemkit/idem/storage/storagetest"
	"github.com/redis/rueidis"
)

// FuzzDifferential applies the same random sequence of operations and
// clock steps to the memory store (on an injected clock) and to the
// rueidis store on miniredis (FastForward), and requires the same answer
// from both at every step (see [storagetest.Differential]). Seeds:
// storagetest.DiffSeeds and testdata/fuzz/FuzzDifferential (redisstore's
// corpus).
func FuzzDifferential(f *testing.F) {
	mr := miniredis.RunT(f)
	// No silence is given up on: miniredis runs in this process, and on a
	// loaded machine (CI, 2 shared cores, fuzz workers) it may answer
	// later than any timeout, a difference the fuzzer would report
	// although the stores agreed. No resend either: a resent Issue would
	// answer ErrExists where the memory store issued.
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true, DisableRetry: true,
		ConnWriteTimeout: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(c.Close)
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
			Store:     rueidisstore.New(c, rueidisstore.WithPrefix("diff:")),
			Advance: func(d time.Duration) {
				offset.Add(int64(d))
				mr.FastForward(d)
			},
		})
	})
}
