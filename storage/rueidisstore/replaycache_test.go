package rueidisstore_test

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/rueidisstore"
	"github.com/redis/rueidis"
)

// cachingClient is client with rueidis's client-side caching on, within
// 1 MiB a connection.
func cachingClient(t *testing.T, addr string) rueidis.Client {
	t.Helper()
	opt := rueidisstore.ClientOption(addr)
	opt.DisableCache, opt.CacheSizeEachConn = false, 1<<20
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// replay acquires key for a new owner and wants its done entry with rec.
func replay(t *testing.T, s *rueidisstore.Store, key, rec string) {
	t.Helper()
	res, err := s.Acquire(t.Context(), key, "retry", "fp", time.Minute)
	if err != nil || res.State != storage.Done || string(res.Record) != rec {
		t.Fatalf("replay of %s: %+v, %v; want done with %q", key, res, err, rec)
	}
}

// TestReplayCache: replays of a key done are served from the client's
// memory once read (no command reaches the server); an entry in flight
// never is; a removal (what idemctl rm does) and an expiry reach every
// instance's cache, and what a removal leaves open is measured.
func TestReplayCache(t *testing.T) {
	addr := redistest.Start(t)
	admin := client(t, addr)
	ctx := t.Context()
	writer := rueidisstore.New(client(t, addr), rueidisstore.WithEvictionAllowed())
	b := rueidisstore.New(cachingClient(t, addr), rueidisstore.WithEvictionAllowed(), rueidisstore.WithReplayCache(time.Minute))
	c := rueidisstore.New(cachingClient(t, addr), rueidisstore.WithEvictionAllowed(), rueidisstore.WithReplayCache(time.Minute))
	complete := func(key, rec string, ttl time.Duration) {
		t.Helper()
		if res, err := writer.Acquire(ctx, key, "owner", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatalf("acquire %s: %+v, %v", key, res, err)
		}
		if err := writer.Complete(ctx, key, "owner", []byte(rec), ttl); err != nil {
			t.Fatal(err)
		}
	}

	// An entry in flight is never served from the cache.
	if res, err := writer.Acquire(ctx, "busy", "owner", "fp", time.Minute); err != nil || res.State != storage.Acquired {
		t.Fatalf("acquire busy: %+v, %v", res, err)
	}
	for range 3 {
		if res, err := b.Acquire(ctx, "busy", "retry", "fp", time.Minute); err != nil || res.State != storage.InFlight {
			t.Fatalf("acquire of an entry in flight: %+v, %v", res, err)
		}
	}

	complete("k", "the record", time.Hour)
	for _, s := range []*rueidisstore.Store{b, c} {
		replay(t, s, "k", "the record") // SET NX GET: the key is done
		replay(t, s, "k", "the record") // read through the cache: a GET
	}
	before := commandStats(t, admin)
	for range 100 {
		replay(t, b, "k", "the record")
		replay(t, c, "k", "the record")
	}
	after := commandStats(t, admin)
	for _, cmd := range []string{"get", "set", "pttl", "evalsha", "multi", "client|caching"} {
		if after[cmd] != before[cmd] {
			t.Errorf("200 replays from the cache sent %d %s, want none", after[cmd]-before[cmd], cmd)
		}
	}

	// A removal reaches both caches: no replay of the removed record once
	// the notice is read; how long that took is logged.
	e, err := writer.Lookup(ctx, "k", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Remove(ctx, "k", e.Version); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	for name, s := range map[string]*rueidisstore.Store{"b": b, "c": c} {
		for stale := 0; ; stale++ {
			res, err := s.Acquire(ctx, "k", "after-"+name, "fp", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if res.State == storage.Acquired {
				t.Logf("instance %s: acquired %v after Remove returned, after %d replays of the removed record", name, time.Since(removed), stale)
				break
			}
			if res.State != storage.Done || time.Since(removed) > 5*time.Second {
				t.Fatalf("instance %s: %+v %v after the removal", name, res, time.Since(removed))
			}
		}
		// The key is in flight now, for this instance's new owner: the
		// other instance must see it so, not a replay.
		if err := s.Release(ctx, "k", "after-"+name); err != nil {
			t.Fatal(err)
		}
	}

	// An expiry: the cache keeps nothing past the server's TTL.
	complete("short", "short-lived", 300*time.Millisecond)
	replay(t, b, "short", "short-lived")
	replay(t, b, "short", "short-lived") // cached, for at most the PTTL left
	for {
		if n, err := admin.Do(ctx, admin.B().Exists().Key("idem:short").Build()).AsInt64(); err != nil || n == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond) // the server's clock: nothing to wait on but time
	}
	if res, err := b.Acquire(ctx, "short", "after-expiry", "fp", time.Minute); err != nil || res.State != storage.Acquired {
		t.Fatalf("acquire after the expiry: %+v, %v; want acquired", res, err)
	}
}

// BenchmarkHotReplay measures replays of one done key (a retry storm),
// 32 goroutines, without and with WithReplayCache, on a server of its
// own: replays a second (ns/op), and the server's commands and their
// time (INFO commandstats) per replay.
//
//	go test -run '^$' -bench HotReplay -benchtime 100000x ./storage/rueidisstore
func BenchmarkHotReplay(b *testing.B) {
	addr := redistest.Start(b)
	admin := client(b, addr)
	for _, cached := range []bool{false, true} {
		b.Run(map[bool]string{false: "without", true: "cached"}[cached], func(b *testing.B) {
			c := client(b, addr)
			opts := []rueidisstore.Option{rueidisstore.WithEvictionAllowed(), rueidisstore.WithPrefix("hot:")}
			if cached {
				opt := rueidisstore.ClientOption(addr)
				opt.DisableCache = false
				var err error
				if c, err = rueidis.NewClient(opt); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(c.Close)
				opts = append(opts, rueidisstore.WithReplayCache(time.Minute))
			}
			s := rueidisstore.New(c, opts...)
			ctx := b.Context()
			if res, err := s.Acquire(ctx, "k", "owner", "fp", time.Minute); err == nil && res.State == storage.Acquired {
				if err := s.Complete(ctx, "k", "owner", []byte(strings.Repeat("r", 512)), time.Hour); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := s.Acquire(ctx, "k", "retry", "fp", time.Minute); err != nil { // the key known done
				b.Fatal(err)
			}
			do(b, admin, "CONFIG", "RESETSTAT")
			b.SetParallelism(max(1, 32/runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if res, err := s.Acquire(ctx, "k", "retry", "fp", time.Minute); err != nil || res.State != storage.Done {
						b.Errorf("replay: %+v, %v", res, err)
						return
					}
				}
			})
			b.StopTimer()
			var calls int64
			var usec float64
			info, _ := admin.Do(ctx, admin.B().Info().Section("commandstats").Build()).ToString()
			for line := range strings.Lines(info) {
				name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
				if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_config" || name == "cmdstat_info" {
					continue
				}
				for f := range strings.SplitSeq(fields, ",") {
					k, v, _ := strings.Cut(f, "=")
					switch k {
					case "calls":
						n, _ := strconv.ParseInt(v, 10, 64)
						calls += n
					case "usec":
						n, _ := strconv.ParseFloat(v, 64)
						usec += n
					}
				}
			}
			b.ReportMetric(float64(calls)/float64(b.N), "commands/replay")
			b.ReportMetric(usec/float64(b.N), "server-µs/replay")
		})
	}
}
