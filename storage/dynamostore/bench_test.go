package dynamostore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
)

// BenchmarkStore measures the store's operations on the test's dynalite,
// one goroutine, as the middleware makes them: a first execution (Acquire
// and Complete), a replay (Acquire of a done entry), a conflict (Acquire
// of a key in flight). Each also reports requests/op, the HTTP requests
// the client sent per operation (its transport counts them): 2 for each
// on dynalite, where a replay and a conflict are a conditional PutItem
// that fails and a consistent GetItem, since dynalite sends no item back
// with the failed condition; on DynamoDB, which does, they are the
// PutItem alone. dynalite answers from memory, in Node.js, on the same
// machine: its times are its own, not DynamoDB's (a few milliseconds a
// request over the network, within a region).
//
//	go test -run '^$' -bench . -benchmem ./storage/dynamostore/
func BenchmarkStore(b *testing.B) {
	tb := newTable(b)
	s, ctx := tb.open(b), context.Background()
	rec := make([]byte, 333) // a typical record, as docs/performance.md measures it
	// run measures op under name, with its requests per operation.
	run := func(name string, op func(b *testing.B)) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			tb.count.take()
			for b.Loop() {
				op(b)
			}
			b.ReportMetric(float64(total(tb.count.take()))/float64(b.N), "requests/op")
		})
	}
	// The keys of first are numbered across its runs (-count runs it
	// again on the same table): each is new.
	n := 0
	run("first", func(b *testing.B) {
		n++
		k := "first-" + strconv.Itoa(n)
		if res, err := s.Acquire(ctx, k, "owner", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			b.Fatal(res.State, err)
		}
		if err := s.Complete(ctx, k, "owner", rec, time.Hour); err != nil {
			b.Fatal(err)
		}
	})
	s.Acquire(ctx, "done", "owner", "fp", time.Minute)
	s.Complete(ctx, "done", "owner", rec, time.Hour)
	run("replay", func(b *testing.B) {
		if res, err := s.Acquire(ctx, "done", "other", "fp", time.Minute); err != nil || res.State != storage.Done {
			b.Fatal(res.State, err)
		}
	})
	s.Acquire(ctx, "busy", "owner", "fp", time.Hour)
	run("conflict", func(b *testing.B) {
		if res, err := s.Acquire(ctx, "busy", "other", "fp", time.Minute); err != nil || res.State != storage.InFlight {
			b.Fatal(res.State, err)
		}
	})
}
