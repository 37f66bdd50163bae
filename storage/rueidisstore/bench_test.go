package rueidisstore_test

import (
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/rueidisstore"
	"github.com/redis/rueidis"
)

// BenchmarkStore measures the store's two paths on the shared
// redis-server, through a client with ClientOption's options, one
// goroutine at a time and b.RunParallel's (GOMAXPROCS goroutines; -cpu
// changes it): a first execution (Acquire of a new key, then Complete
// with a record of 512 bytes, as idem's record of a small JSON answer)
// and a replay (Acquire of a done key). redisstore has the same
// benchmark, for a comparison on the same server.
func BenchmarkStore(b *testing.B) {
	c, err := rueidis.NewClient(rueidisstore.ClientOption(redistest.Addr(b)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	s := rueidisstore.New(c, rueidisstore.WithPrefix("bench:"+rand.Text()[:8]+":"))
	rec := []byte(strings.Repeat("r", 512))
	owner, fp := rand.Text(), rand.Text()
	ctx := b.Context()
	var n atomic.Int64
	first := func() error {
		key := strconv.FormatInt(n.Add(1), 10)
		if res, err := s.Acquire(ctx, key, owner, fp, 30*time.Second); err != nil || res.State != storage.Acquired {
			return fmt.Errorf("acquire: %+v, %v", res, err)
		}
		return s.Complete(ctx, key, owner, rec, time.Minute)
	}
	replay := func() error {
		if res, err := s.Acquire(ctx, "done", "other", fp, 30*time.Second); err != nil || res.State != storage.Done {
			return fmt.Errorf("acquire of a done key: %+v, %v", res, err)
		}
		return nil
	}
	if _, err := s.Acquire(ctx, "done", owner, fp, 30*time.Second); err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(ctx, "done", owner, rec, time.Hour); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		op   func() error
	}{{"acquire+complete", first}, {"acquire done", replay}} {
		b.Run(bc.name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := bc.op(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := bc.op(); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
