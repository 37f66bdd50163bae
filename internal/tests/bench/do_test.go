package bench

import (
	"context"
	"strconv"
	"testing"

	"github.com/idemkit/idem"
)

// BenchmarkDo measures Middleware.Do on each store: first (a new key per
// iteration: fn runs and its 64-byte result is stored) and replay (the
// stored result of one key). The key is made in the loop: one
// strconv.AppendInt into a reused buffer and a string conversion, 1
// allocation of the figures.
func BenchmarkDo(b *testing.B) {
	result := make([]byte, 64)
	fn := func(context.Context) ([]byte, error) { return result, nil }
	for _, sk := range storeKinds {
		b.Run(sk.name, func(b *testing.B) {
			st := sk.open(b, false)
			m, err := idem.New(st.Store)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.Run("first", func(b *testing.B) {
				buf := []byte("msg-")
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					i++
					if _, err := m.Do(ctx, "bench", string(strconv.AppendInt(buf[:4], int64(i), 10)), fn); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				st.trim(b)
			})
			b.Run("replay", func(b *testing.B) {
				if _, err := m.Do(ctx, "bench", "replayed", fn); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				for b.Loop() {
					if _, err := m.Do(ctx, "bench", "replayed", fn); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
