package pgstore_test

import (
	"context"
	"crypto/rand"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkStore measures the store's operations on the test server, one
// goroutine, as the middleware makes them: a first execution (Acquire and
// Complete), a replay (Acquire of a done entry), a conflict (Acquire of a
// key in flight). The test server runs without fsync: on a real one, each
// write (first, conflict) also waits for its commit to reach the disk.
//
//	go test -run '^$' -bench . ./storage/pgstore/
func BenchmarkStore(b *testing.B) {
	pool := testPool(b, func(cfg *pgxpool.Config) { cfg.MaxConns = 4 })
	d := openOn(b, pool)
	s, ctx := d.store, context.Background()
	rec := make([]byte, 333) // a typical record, as docs/performance.md measures it
	b.Run("first", func(b *testing.B) {
		b.ReportAllocs()
		run := rand.Text()[:8] // keys of this run's own: with -count, the table holds the earlier runs'
		for i := 0; b.Loop(); i++ {
			k := "first-" + run + "-" + strconv.Itoa(i)
			if _, err := s.Acquire(ctx, k, "owner", "fp", time.Minute); err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, k, "owner", rec, time.Hour); err != nil {
				b.Fatal(err)
			}
		}
	})
	s.Acquire(ctx, "done", "owner", "fp", time.Minute)
	s.Complete(ctx, "done", "owner", rec, time.Hour)
	b.Run("replay", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Acquire(ctx, "done", "other", "fp", time.Minute); err != nil {
				b.Fatal(err)
			}
		}
	})
	s.Acquire(ctx, "busy", "owner", "fp", time.Hour)
	b.Run("conflict", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Acquire(ctx, "busy", "other", "fp", time.Minute); err != nil {
				b.Fatal(err)
			}
		}
	})
}
