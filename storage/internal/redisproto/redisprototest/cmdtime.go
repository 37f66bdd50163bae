package redisprototest

import (
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/internal/redisproto"
)

// CommandTime is the body of both Redis stores' BenchmarkCommandTime: it
// measures what store s costs Redis itself, the time the server spends in
// the commands of one operation by its own accounting (CONFIG RESETSTAT
// before a phase, INFO commandstats after), which does not depend on the
// client's machine. Each iteration is one first execution (Acquire of a
// new key, then Complete with a record of 512 bytes), one replay (Acquire
// of a done key), and the naive floor of each, sent with do on the same
// server: SET NX PX of a lock then SET PX of the record, and one GET. It
// reports the server's µs per operation and their ratios.
//
// A script's time includes the commands it calls, which commandstats also
// counts under their own names: a phase that runs a script counts the
// scripts' time only, so each phase sends one kind of command (the
// Acquires of the first executions and their Completes are separate
// phases). 32 goroutines send the operations; the server must be the
// benchmark's own.
func CommandTime(b *testing.B, s Store, do func(ctx context.Context, args ...string) (redisproto.Reply, error)) {
	ctx := b.Context()
	rec := strings.Repeat("r", 512)
	owner, fp := rand.Text(), rand.Text()
	send := func(args ...string) error {
		_, err := do(ctx, args...)
		return err
	}
	// Warm up: the policy's verdict, the scripts cached, the connections.
	if _, err := s.Acquire(ctx, "done", owner, fp, 30*time.Second); err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(ctx, "done", owner, []byte(rec), time.Hour); err != nil {
		b.Fatal(err)
	}
	if err := send("SET", "floor:done", rec, "PX", "3600000"); err != nil {
		b.Fatal(err)
	}
	// phase runs f(0) to f(n-1) and returns the server's µs per call.
	phase := func(n int, f func(i int) error) float64 {
		b.Helper()
		if err := send("CONFIG", "RESETSTAT"); err != nil {
			b.Fatal(err)
		}
		parallel(b, n, f)
		info, err := do(ctx, "INFO", "commandstats")
		if err != nil {
			b.Fatal(err)
		}
		return serverMicros(info.Str) / float64(n)
	}
	b.ResetTimer()
	n := max(b.N/rounds, 1)
	best := newBest()
	for r := range rounds {
		key := func(i int) string { return "r" + strconv.Itoa(r) + ":" + strconv.Itoa(i) }
		best.add(
			phase(n, func(i int) error {
				res, err := s.Acquire(ctx, key(i), owner, fp, 30*time.Second)
				if err == nil && res.State != storage.Acquired {
					err = fmt.Errorf("acquire: %v", res.State)
				}
				return err
			}),
			phase(n, func(i int) error { return s.Complete(ctx, key(i), owner, []byte(rec), time.Minute) }),
			phase(n, func(int) error {
				res, err := s.Acquire(ctx, "done", "other", fp, 30*time.Second)
				if err == nil && res.State != storage.Done {
					err = fmt.Errorf("replay: %v", res.State)
				}
				return err
			}),
			phase(n, func(i int) error { return send("SET", "floor:"+key(i), owner, "NX", "PX", "30000") }),
			phase(n, func(i int) error { return send("SET", "floor:"+key(i), rec, "PX", "60000") }),
			phase(n, func(int) error { return send("GET", "floor:done") }),
		)
	}
	b.StopTimer()
	best.report(b)
}

// rounds is how many times BenchmarkCommandTime runs each phase, with a
// part of b.N each: the least time of a phase counts, as the machine's
// other work only ever adds to a command's time.
const rounds = 5

// best is the least µs per call of each phase: Acquire of a new key,
// Complete, Acquire of a done key; the floor's SET NX PX, SET PX, GET.
type best [6]float64

func newBest() *best {
	var b best
	for i := range b {
		b[i] = math.Inf(1)
	}
	return &b
}

func (b *best) add(phases ...float64) {
	for i, p := range phases {
		b[i] = min(b[i], p)
	}
}

// report reports the server's µs per operation of the store and of the
// floor, and their ratios.
func (p *best) report(b *testing.B) {
	first, floorFirst, replay, floorReplay := p[0]+p[1], p[3]+p[4], p[2], p[5]
	b.Logf("µs per call: acquire %.2f, complete %.2f, replay %.2f; floor: SET NX PX %.2f, SET PX %.2f, GET %.2f",
		p[0], p[1], p[2], p[3], p[4], p[5])
	b.ReportMetric(first, "µs/first")
	b.ReportMetric(floorFirst, "floor-µs/first")
	b.ReportMetric(first/floorFirst, "x-floor/first")
	b.ReportMetric(replay, "µs/replay")
	b.ReportMetric(floorReplay, "floor-µs/replay")
	b.ReportMetric(replay/floorReplay, "x-floor/replay")
	b.ReportMetric(0, "ns/op")
}

// serverMicros sums the µs of the commands in an INFO commandstats
// answer, but CONFIG's and INFO's; when scripts ran, the scripts' only
// (their time includes the commands they call).
func serverMicros(info string) float64 {
	var all, scripts int64
	for line := range strings.Lines(info) {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found || strings.HasPrefix(name, "config") || strings.HasPrefix(name, "info") {
			continue
		}
		for f := range strings.SplitSeq(fields, ",") {
			if k, v, _ := strings.Cut(f, "="); k == "usec" {
				n, _ := strconv.ParseInt(v, 10, 64)
				all += n
				if name == "evalsha" || name == "eval" {
					scripts += n
				}
			}
		}
	}
	if scripts > 0 {
		return float64(scripts)
	}
	return float64(all)
}

// parallel runs f(0) to f(n-1) on 32 goroutines.
func parallel(b *testing.B, n int, f func(i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
