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
// The redis store needs a redis-server (see internal/redistest) and is
// skipped without one.
func BenchmarkMiddleware(b *testing.B) {
	for _, a := range adapters {
		b.Run(a.name, func(b *testing.B) {
			for _, sk := range storeKinds {
				b.Run(sk.name, func(b *testing.B) {
					var small, large *setup
					var base *cost
					for _, bc := range cases {
						b.Run(bc.name, func(b *testing.B) {
							var s *setup
							if bc.large {
								if large == nil {
									large = newSetup(b, a, sk, true)
								}
								s = large
							} else {
								if small == nil {
									small = newSetup(b, a, sk, false)
								}
								s = small
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

// measure runs the case's request b.N times and returns its cost.
func measure(b *testing.B, bc benchCase, s *setup) cost {
	send, ok := bc.prepare(b, s)
	if send(); !ok() {
		b.Fatalf("%s: unexpected answer", bc.name)
	}
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for b.Loop() {
		send()
	}
	runtime.ReadMemStats(&after)
	if !ok() {
		b.Fatalf("%s: unexpected answer", bc.name)
	}
	n := float64(b.N)
	return cost{
		ns:     float64(b.Elapsed().Nanoseconds()) / n,
		allocs: float64(after.Mallocs-before.Mallocs) / n,
		bytes:  float64(after.TotalAlloc-before.TotalAlloc) / n,
	}
}
