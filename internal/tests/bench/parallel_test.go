package bench

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
)

// BenchmarkParallel measures the memory store and the middleware on it
// under b.RunParallel (GOMAXPROCS goroutines, -cpu sets it), so that what
// one lock costs shows as time per operation that does not fall as -cpu
// grows, and in a mutex profile (issue 28), even where fewer cores exist
// than -cpu asks for:
//
//	go test -run '^$' -bench Parallel -cpu 1,2,4,8,16 -mutexprofile mutex.out ./internal/tests/bench
//	go tool pprof -top mutex.out
//
//	BenchmarkParallel/memstore/first    Acquire and Complete of a new key (a 200-byte response's record)
//	BenchmarkParallel/memstore/replay   Acquire of a done key, one key per goroutine
//	BenchmarkParallel/nethttp/bare      the handler without the middleware
//	BenchmarkParallel/nethttp/first     the middleware on the memory store, a new key per request
//	BenchmarkParallel/nethttp/replay    the same, one stored key per goroutine
//
// Each uses a store of its own with the default bound (100,000 entries):
// first executions fill it, and from then on each evicts the oldest
// record, as a busy service's store does.
func BenchmarkParallel(b *testing.B) {
	ctx := context.Background()
	const lease, ttl = idem.DefaultLease, idem.DefaultTTL
	const fp, owner = "0123456789abcdef", "0123456789abcdef0123456789abcdef"
	record := make([]byte, 200+storedHeaderBytes+64) // about the record of the response below
	newStore := func(b *testing.B) *memstore.Store {
		s := memstore.New()
		b.Cleanup(func() { s.Close() })
		return s
	}
	// goroutines numbers the goroutines of a RunParallel, for their keys.
	var goroutines atomic.Uint64
	// keyMaker returns a function that makes a goroutine's keys: "k<g>-<n>".
	keyMaker := func() func() string {
		buf := strconv.AppendUint([]byte("k"), goroutines.Add(1), 10)
		buf = append(buf, '-')
		prefix, n := len(buf), uint64(0)
		return func() string {
			n++
			buf = strconv.AppendUint(buf[:prefix], n, 10)
			return string(buf)
		}
	}

	b.Run("memstore", func(b *testing.B) {
		b.Run("first", func(b *testing.B) {
			s := newStore(b)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				next := keyMaker()
				for pb.Next() {
					k := next()
					res, err := s.Acquire(ctx, k, owner, fp, lease)
					if err != nil || res.State != storage.Acquired {
						b.Errorf("acquire: %v %v", res.State, err)
						return
					}
					if err := s.Complete(ctx, k, owner, record, ttl); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
		b.Run("replay", func(b *testing.B) {
			s := newStore(b)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				k := keyMaker()()
				if _, err := s.Acquire(ctx, k, owner, fp, lease); err != nil {
					b.Error(err)
					return
				}
				if err := s.Complete(ctx, k, owner, record, ttl); err != nil {
					b.Error(err)
					return
				}
				for pb.Next() {
					res, err := s.Acquire(ctx, k, owner+"x", fp, lease)
					if err != nil || res.State != storage.Done {
						b.Errorf("acquire: %v %v", res.State, err)
						return
					}
				}
			})
		})
	})

	b.Run("nethttp", func(b *testing.B) {
		a := adapters[0] // nethttp
		for _, c := range []struct {
			name string
			// run sends requests with its own client until pb says to
			// stop, and reports an unexpected answer.
			run func(b *testing.B, s *setup, pb *testing.PB)
		}{
			{"bare", func(b *testing.B, s *setup, pb *testing.PB) {
				c := newClient(s.bare, http.MethodPost)
				for pb.Next() {
					if c.send(); c.w.status != http.StatusCreated {
						b.Errorf("bare: status %d", c.w.status)
						return
					}
				}
			}},
			{"first", func(b *testing.B, s *setup, pb *testing.PB) {
				c := newClient(s.h, http.MethodPost)
				for pb.Next() {
					c.setKey(keySeq.Add(1))
					if c.send(); c.w.status != http.StatusCreated || c.replayed() {
						b.Errorf("first: status %d, replayed %v", c.w.status, c.replayed())
						return
					}
				}
			}},
			{"replay", func(b *testing.B, s *setup, pb *testing.PB) {
				c := newClient(s.h, http.MethodPost)
				c.setKey(keySeq.Add(1))
				if c.send(); c.w.status != http.StatusCreated {
					b.Errorf("replay: the first request got %d", c.w.status)
					return
				}
				for pb.Next() {
					if c.send(); c.w.status != http.StatusCreated || !c.replayed() {
						b.Errorf("replay: status %d, replayed %v", c.w.status, c.replayed())
						return
					}
				}
			}},
		} {
			b.Run(c.name, func(b *testing.B) {
				st := newStore(b)
				s := newSetupOn(b, a, store{Store: st, mem: st}, handler{})
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) { c.run(b, s, pb) })
			})
		}
	})
}
