package bench

import (
	"runtime"
	"testing"
)

// BenchmarkMiddleware measures every adapter on every store, case by case:
//
//	BenchmarkMiddleware/<adapter>/<store>/<case>
//
// bare is the same handler without the middleware, measured in the same
// run; every other case also reports its cost over bare (ns-over-bare/op,
// allocs-over-bare/op, B-over-bare/op), so keep bare in any -bench filter.
// The redis store needs a redis-server (see internal/redistest), the
// postgres store (pgstore) and the postgres-sql store (sqlstore's
// PostgreSQL dialect through database/sql and pgx's driver) a PostgreSQL
// server (see internal/pgtest), the mysql store (sqlstore) a MariaDB (see
// internal/mysqltest), and each is skipped without one. BenchmarkFence
// measures pgstore's Fence, BenchmarkSQLFence sqlstore's.
func BenchmarkMiddleware(b *testing.B) {
	for _, a := range adapters {
		b.Run(a.name, func(b *testing.B) {
			for _, sk := range storeKinds {
				b.Run(sk.name, func(b *testing.B) {
					// The setups belong to this level, so that they stay
					// open (the Redis client) from one case to the next.
					small, large := newSetup(b, a, sk, false), newSetup(b, a, sk, true)
					var base *cost
					for _, bc := range cases {
						b.Run(bc.name, func(b *testing.B) {
							s := small
							if bc.large {
								s = large
							}
							c := measure(b, bc, s)
							if bc.name == "bare" {
								base = &c
								return
							}
							if base != nil {
								b.ReportMetric(c.ns-base.ns, "ns-over-bare/op")
								b.ReportMetric(c.allocs-base.allocs, "allocs-over-bare/op")
								b.ReportMetric(c.bytes-base.bytes, "B-over-bare/op")
							}
						})
					}
				})
			}
		})
	}
}

// cost is what one request cost in a benchmark run.
type cost struct{ ns, allocs, bytes float64 }

// measure runs the case's request b.N times and returns its cost. In the
// large case it deletes the records of a Redis or PostgreSQL store every
// largeKept requests, with the timer stopped and its allocations left out.
func measure(b *testing.B, bc benchCase, s *setup) cost {
	send, ok := bc.prepare(b, s)
	if send(); !ok() {
		b.Fatalf("%s: unexpected answer", bc.name)
	}
	b.ReportAllocs()
	var before, after, t0, t1 runtime.MemStats
	var trimMallocs, trimBytes uint64
	trim := bc.large && s.store.mem == nil // the memory store bounds itself
	runtime.ReadMemStats(&before)
	for i := 1; b.Loop(); i++ {
		send()
		if trim && i%largeKept == 0 {
			b.StopTimer()
			runtime.ReadMemStats(&t0)
			s.store.trim(b)
			runtime.ReadMemStats(&t1)
			trimMallocs += t1.Mallocs - t0.Mallocs
			trimBytes += t1.TotalAlloc - t0.TotalAlloc
			b.StartTimer()
		}
	}
	runtime.ReadMemStats(&after)
	if !ok() {
		b.Fatalf("%s: unexpected answer", bc.name)
	}
	n := float64(b.N)
	return cost{
		ns:     float64(b.Elapsed().Nanoseconds()) / n,
		allocs: float64(after.Mallocs-before.Mallocs-trimMallocs) / n,
		bytes:  float64(after.TotalAlloc-before.TotalAlloc-trimBytes) / n,
	}
}
