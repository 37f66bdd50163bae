package redisstore_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/idemkit/idem/storage/storagetest"
	"github.com/redis/go-redis/v9"
)

// Main stops the shared redis-server and checks for leaked goroutines.
func TestMain(m *testing.M) { leakcheck.Main(redistest.Wrap(m)) }

// backend is a Redis to run a test on: miniredis, or a real server.
type backend struct {
	name string
	// open returns a client and, for miniredis, the server.
	open func(t *testing.T) (*redis.Client, *miniredis.Miniredis)
}

var backends = []backend{
	{"miniredis", func(t *testing.T) (*redis.Client, *miniredis.Miniredis) {
		mr := miniredis.RunT(t)
		return client(t, mr.Addr()), mr
	}},
	{"redis", func(t *testing.T) (*redis.Client, *miniredis.Miniredis) {
		return client(t, redistest.Addr(t)), nil
	}},
}

// client returns a client that fails at once, without retries, so that
// tests of failures are quick.
func client(t testing.TB, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// prefix returns a prefix no other test uses, for tests on a shared server.
func prefix(name string) string { return "test:" + name + ":" + rand.Text()[:8] + ":" }

func each(t *testing.T, f func(t *testing.T, rdb *redis.Client, mr *miniredis.Miniredis)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			rdb, mr := b.open(t)
			f(t, rdb, mr)
		})
	}
}

func TestContractMiniredis(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		mr := miniredis.RunT(t)
		// Advance moves both clocks of miniredis: the TTLs' and TIME's.
		now := time.Now()
		mr.SetTime(now)
		advance := func(d time.Duration) {
			now = now.Add(d)
			mr.SetTime(now)
			mr.FastForward(d)
		}
		return storagetest.Harness{Store: redisstore.New(client(t, mr.Addr())), Advance: advance}
	})
}

func TestContractRedis(t *testing.T) {
	rdb := client(t, redistest.Addr(t))
	s := redisstore.New(rdb, redisstore.WithPrefix(prefix("contract")))
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: s}
	})
}

// TestContractRedisCluster runs the suite through a redis.ClusterClient on
// a real cluster of three masters: each script routes by KEYS[1], and the
// suite's random keys land on every master.
func TestContractRedisCluster(t *testing.T) {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	s := redisstore.New(rdb, redisstore.WithPrefix(prefix("cluster")))
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: s}
	})
}

// op is one store operation with the outcome it must have.
type op struct {
	name string
	run  func(ctx context.Context, s *redisstore.Store) error
}

func acquireOp(name, key, owner string, want storage.State) op {
	return op{name, func(ctx context.Context, s *redisstore.Store) error {
		res, err := s.Acquire(ctx, key, owner, "fp", time.Minute)
		if err == nil && res.State != want {
			return errors.New("state " + res.State.String() + ", want " + want.String())
		}
		return err
	}}
}

func acquireIssuedOp(name, key, owner string, want storage.State) op {
	return op{name, func(ctx context.Context, s *redisstore.Store) error {
		res, err := s.AcquireIssued(ctx, key, owner, "fp", time.Minute)
		if err == nil && res.State != want {
			return errors.New("state " + res.State.String() + ", want " + want.String())
		}
		return err
	}}
}

func wantErr(want error, f func(ctx context.Context, s *redisstore.Store) error) func(ctx context.Context, s *redisstore.Store) error {
	return func(ctx context.Context, s *redisstore.Store) error {
		if err := f(ctx, s); !errors.Is(err, want) {
			return errors.New("error " + errString(err) + ", want " + want.Error())
		}
		return nil
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// everyOutcome walks every outcome of every operation.
var everyOutcome = []op{
	acquireOp("acquire new", "k", "o", storage.Acquired),
	acquireOp("acquire again", "k", "o", storage.Acquired),
	acquireOp("acquire in flight", "k", "o2", storage.InFlight),
	{"extend", func(ctx context.Context, s *redisstore.Store) error { return s.Extend(ctx, "k", "o", time.Minute) }},
	{"extend not owner", wantErr(storage.ErrNotOwner, func(ctx context.Context, s *redisstore.Store) error { return s.Extend(ctx, "k", "o2", time.Minute) })},
	{"release not owner", wantErr(storage.ErrNotOwner, func(ctx context.Context, s *redisstore.Store) error { return s.Release(ctx, "k", "o2") })},
	{"complete not owner", wantErr(storage.ErrNotOwner, func(ctx context.Context, s *redisstore.Store) error {
		return s.Complete(ctx, "k", "o2", []byte("rec"), time.Minute)
	})},
	{"complete", func(ctx context.Context, s *redisstore.Store) error {
		return s.Complete(ctx, "k", "o", []byte("rec"), time.Minute)
	}},
	{"complete resent", func(ctx context.Context, s *redisstore.Store) error {
		return s.Complete(ctx, "k", "o", []byte("rec"), time.Minute)
	}},
	acquireOp("acquire done", "k", "o2", storage.Done),
	acquireOp("acquire to release", "k2", "o", storage.Acquired),
	{"release", func(ctx context.Context, s *redisstore.Store) error { return s.Release(ctx, "k2", "o") }},
	{"release missing", func(ctx context.Context, s *redisstore.Store) error { return s.Release(ctx, "k2", "o") }},
	{"issue", func(ctx context.Context, s *redisstore.Store) error { return s.Issue(ctx, "i", time.Minute) }},
	{"issue exists", wantErr(storage.ErrExists, func(ctx context.Context, s *redisstore.Store) error { return s.Issue(ctx, "i", time.Minute) })},
	acquireIssuedOp("acquire issued, not issued", "never", "o", storage.NotIssued),
	acquireIssuedOp("acquire issued", "i", "o", storage.Acquired),
	acquireIssuedOp("acquire issued again", "i", "o", storage.Acquired),
	acquireIssuedOp("acquire issued in flight", "i", "o2", storage.InFlight),
	{"release to issued", func(ctx context.Context, s *redisstore.Store) error { return s.Release(ctx, "i", "o") }},
	{"release issued", func(ctx context.Context, s *redisstore.Store) error { return s.Release(ctx, "i", "o") }},
	{"extend issued", wantErr(storage.ErrNotOwner, func(ctx context.Context, s *redisstore.Store) error { return s.Extend(ctx, "i", "o", time.Minute) })},
	{"complete issued", wantErr(storage.ErrNotOwner, func(ctx context.Context, s *redisstore.Store) error {
		return s.Complete(ctx, "i", "o", []byte("rec"), time.Minute)
	})},
	acquireOp("acquire takes issued", "i", "o", storage.Acquired),
	{"complete taken from an issue", func(ctx context.Context, s *redisstore.Store) error {
		return s.Complete(ctx, "i", "o", []byte("rec"), time.Minute)
	}},
	acquireIssuedOp("acquire issued done", "i", "o2", storage.Done),
}

// TestOneRoundTripEach counts the commands each operation sends, once the
// scripts are cached: exactly one. After SCRIPT FLUSH, the first run of
// each script costs two (EVALSHA answered NOSCRIPT, then EVAL) and works.
// The first operation of each store costs one more, the INFO memory that
// checks the maxmemory-policy, and no later one does (the verdict stands
// for PolicyCheckEvery, far longer than the test).
func TestOneRoundTripEach(t *testing.T) {
	each(t, func(t *testing.T, rdb *redis.Client, _ *miniredis.Miniredis) {
		ctx := t.Context()
		var c commandCounter
		rdb.AddHook(&c)
		if err := rdb.Ping(ctx).Err(); err != nil { // sets up the connection
			t.Fatal(err)
		}
		run := func(pass string, s *redisstore.Store, want func(i int) int64) {
			t.Helper()
			for i, o := range everyOutcome {
				c.Reset()
				if err := o.run(ctx, s); err != nil {
					t.Fatalf("%s: %s: %v", pass, o.name, err)
				}
				if n := c.Count(); n != want(i) {
					t.Errorf("%s: %s took %d round trips, want %d", pass, o.name, n, want(i))
				}
			}
		}
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		// Index of the first use of each script in everyOutcome.
		first := map[int]bool{0: true, 3: true, 5: true, 6: true, 13: true, 15: true}
		check := func(i int) int64 {
			if i == 0 {
				return 1
			}
			return 0
		}
		run("scripts not cached", redisstore.New(rdb, redisstore.WithPrefix(prefix("flush"))), func(i int) int64 {
			if first[i] {
				return 2 + check(i)
			}
			return 1
		})
		run("scripts cached", redisstore.New(rdb, redisstore.WithPrefix(prefix("rt"))), func(i int) int64 { return 1 + check(i) })
		run("scripts cached, policy known", redisstore.New(rdb, redisstore.WithPrefix(prefix("rt2")), redisstore.WithEvictionAllowed()),
			func(int) int64 { return 1 })
	})
}

// TestKeysPrefixedWithTTL checks the layout byte for byte, and that every
// key is under the prefix and has a TTL, in milliseconds, rounded up.
func TestKeysPrefixedWithTTL(t *testing.T) {
	mr := miniredis.RunT(t)
	s := redisstore.New(client(t, mr.Addr()), redisstore.WithPrefix("app:"))
	ctx := t.Context()
	// The server's clock, for the stamps: TIME in a script answers it.
	t0 := time.UnixMilli(1_800_000_000_123)
	mr.SetTime(t0)
	stamp := func(at time.Time) string {
		b := binary.BigEndian.AppendUint64(nil, uint64(at.UnixMilli()))
		return "T" + string(b[2:])
	}
	check := func(key, value string, ttl time.Duration) {
		t.Helper()
		if v, err := mr.Get(key); err != nil || v != value {
			t.Fatalf("%s holds %q (%v), want %q", key, v, err, value)
		}
		if got := mr.TTL(key); got != ttl {
			t.Fatalf("%s TTL %v, want %v", key, got, ttl)
		}
	}
	s.Acquire(ctx, "k", "owner", "fp", 1500*time.Millisecond)
	check("app:k", stamp(t0)+"P\x02fpowner", 1500*time.Millisecond)
	mr.SetTime(t0.Add(time.Second))                   // a renewal keeps the stamp
	s.Acquire(ctx, "k", "owner", "fp", 2*time.Second) // renewed
	check("app:k", stamp(t0)+"P\x02fpowner", 2*time.Second)
	s.Extend(ctx, "k", "owner", 1001*time.Microsecond) // rounded up
	check("app:k", stamp(t0)+"P\x02fpowner", 2*time.Millisecond)
	mr.SetTime(t0.Add(2 * time.Second)) // done: stamped anew
	s.Complete(ctx, "k", "owner", []byte{0, 1, 2}, 36*time.Hour)
	check("app:k", stamp(t0.Add(2*time.Second))+"C\x02fp\x05owner\x00\x01\x02", 36*time.Hour)
	s.Acquire(ctx, "sub", "o", "", 100*time.Microsecond)
	check("app:sub", stamp(t0.Add(2*time.Second))+"P\x00o", time.Millisecond)
	mr.SetTime(t0.Add(3 * time.Second))
	s.Acquire(ctx, "k", "other", "x", time.Minute) // a replay changes nothing
	check("app:k", stamp(t0.Add(2*time.Second))+"C\x02fp\x05owner\x00\x01\x02", 36*time.Hour)
	// An owner of 128 bytes or more: its length takes two bytes or more.
	for _, c := range []struct {
		n   int
		len string
	}{{127, "\x7f"}, {128, "\x80\x01"}, {300, "\xac\x02"}, {16384, "\x80\x80\x01"}} {
		long := strings.Repeat("o", c.n)
		s.Acquire(ctx, "long", long, "fp", time.Minute)
		s.Complete(ctx, "long", long, []byte("r"), time.Hour)
		check("app:long", stamp(t0.Add(3*time.Second))+"C\x02fp"+c.len+long+"r", time.Hour)
		if err := s.Complete(ctx, "long", long, []byte("r"), time.Hour); err != nil {
			t.Fatalf("resend by an owner of %d bytes: %v", c.n, err)
		}
		if err := s.Complete(ctx, "long", long[1:], []byte("r"), time.Hour); !errors.Is(err, storage.ErrNotOwner) {
			t.Fatalf("complete by an owner of %d bytes, one byte short: %v, want ErrNotOwner", c.n, err)
		}
		if res, err := s.Acquire(ctx, "long", "x", "", time.Minute); err != nil || res.State != storage.Done || string(res.Record) != "r" || res.Fingerprint != "fp" {
			t.Fatalf("replay of an owner of %d bytes: %+v, %v", c.n, res, err)
		}
		mr.Del("app:long")
	}

	// Issued keys: stamped when issued, taken, released, done.
	at := func(d time.Duration) string { mr.SetTime(t0.Add(d)); return stamp(t0.Add(d)) }
	st := at(10 * time.Second)
	s.Issue(ctx, "i", 90*time.Minute)
	check("app:i", st+"I5400000", 90*time.Minute)
	at(11 * time.Second)
	s.Issue(ctx, "i", time.Minute) // exists: changes nothing
	check("app:i", st+"I5400000", 90*time.Minute)
	st = at(12 * time.Second)
	s.AcquireIssued(ctx, "i", "owner", "fp", 30*time.Second)
	check("app:i", st+"Q\x02fp\x075400000owner", 30*time.Second)
	at(13 * time.Second)
	s.AcquireIssued(ctx, "i", "owner", "fp", time.Minute) // renewed
	check("app:i", st+"Q\x02fp\x075400000owner", time.Minute)
	s.Extend(ctx, "i", "owner", 1001*time.Microsecond) // rounded up
	check("app:i", st+"Q\x02fp\x075400000owner", 2*time.Millisecond)
	st = at(14 * time.Second)
	s.Release(ctx, "i", "owner") // back to issued, for the issue's whole TTL
	check("app:i", st+"I5400000", 90*time.Minute)
	st = at(15 * time.Second)
	s.Acquire(ctx, "i", "o", "", time.Second) // Acquire takes it too
	check("app:i", st+"Q\x00\x075400000o", time.Second)
	st = at(16 * time.Second)
	s.Complete(ctx, "i", "o", []byte("r"), time.Hour)
	check("app:i", st+"C\x00\x01or", time.Hour)
	s.Issue(ctx, "sub-i", time.Nanosecond) // rounded up
	check("app:sub-i", st+"I1", time.Millisecond)
	s.AcquireIssued(ctx, "never", "o", "", time.Minute) // writes nothing
	if keys := mr.Keys(); len(keys) != 4 {
		t.Fatalf("keys %q, want app:k, app:sub, app:i and app:sub-i only", keys)
	}

	// The default prefix.
	redisstore.New(client(t, mr.Addr())).Acquire(ctx, "k", "o", "", time.Minute)
	if !mr.Exists("idem:k") {
		t.Fatalf("keys %q, want idem:k among them", mr.Keys())
	}
}

// TestEveryKeyHasTTLOnRedis runs every operation on a real server and
// checks that each key under the prefix has a TTL.
func TestEveryKeyHasTTLOnRedis(t *testing.T) {
	rdb := client(t, redistest.Addr(t))
	ctx := t.Context()
	p := prefix("ttl")
	s := redisstore.New(rdb, redisstore.WithPrefix(p))
	for _, o := range everyOutcome {
		if err := o.run(ctx, s); err != nil {
			t.Fatalf("%s: %v", o.name, err)
		}
	}
	s.Acquire(ctx, "sub", "o", "", 100*time.Microsecond+time.Minute)
	s.Acquire(ctx, "held", "o", "", time.Minute)
	s.Extend(ctx, "held", "o", 100*time.Microsecond+time.Minute)
	keys, err := rdb.Keys(ctx, p+"*").Result() // a test server: KEYS is fine
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 4 {
		t.Fatalf("keys %q, want k, i, sub and held", keys)
	}
	for _, k := range keys {
		if d, err := rdb.PTTL(ctx, k).Result(); err != nil || d <= 0 {
			t.Errorf("%s PTTL %v (%v), want a TTL", k, d, err)
		}
	}
	if d := rdb.PTTL(ctx, p+"k").Val(); d < 59*time.Second {
		t.Errorf("done entry PTTL %v, want about a minute", d)
	}
}

// TestServerErrors checks that a failing or unreachable server surfaces as
// an error that is neither ErrNotOwner nor ErrInvalid, from every
// operation.
func TestServerErrors(t *testing.T) {
	mr := miniredis.RunT(t)
	s := redisstore.New(client(t, mr.Addr()))
	ctx := t.Context()
	if _, err := s.Acquire(ctx, "k", "o", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	ops := map[string]func() error{
		"acquire":  func() error { _, err := s.Acquire(ctx, "k", "o", "", time.Minute); return err },
		"complete": func() error { return s.Complete(ctx, "k", "o", []byte("r"), time.Minute) },
		"release":  func() error { return s.Release(ctx, "k", "o") },
		"extend":   func() error { return s.Extend(ctx, "k", "o", time.Minute) },
		"issue":    func() error { return s.Issue(ctx, "k", time.Minute) },
		"acquire issued": func() error {
			_, err := s.AcquireIssued(ctx, "k", "o", "", time.Minute)
			return err
		},
	}
	check := func(when string) {
		t.Helper()
		for name, f := range ops {
			err := f()
			if err == nil || errors.Is(err, storage.ErrNotOwner) || errors.Is(err, storage.ErrInvalid) || !strings.HasPrefix(err.Error(), "redisstore: "+name) {
				t.Errorf("%s with %s: %v, want a redisstore error", name, when, err)
			}
		}
	}
	mr.SetError("LOADING Redis is loading the dataset in memory")
	check("an error from the server")
	mr.SetError("")
	mr.Close()
	check("the server closed")
}

// TestRecommendedOptionsFailFast checks the advice in New's documentation:
// with those options a server that accepts connections but never answers
// fails a request at its deadline, not seconds later.
func TestRecommendedOptionsFailFast(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	var mu sync.Mutex
	var held []net.Conn
	conns.Go(func() { // accept and never answer
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		l.Close()
		conns.Wait()
		for _, c := range held {
			c.Close()
		}
	})
	rdb := redis.NewClient(redisstore.ClientOptions(l.Addr().String()))
	t.Cleanup(func() { rdb.Close() })
	s := redisstore.New(rdb)

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = s.Acquire(ctx, "k", "o", "", time.Minute)
	if took := time.Since(start); err == nil || took > time.Second {
		t.Fatalf("Acquire on a stalled server: %v after %v, want an error by the 100ms deadline", err, took)
	}
	if errors.Is(err, storage.ErrNotOwner) || errors.Is(err, storage.ErrInvalid) {
		t.Fatalf("Acquire on a stalled server: %v", err)
	}
}

// TestCorruptValue puts values that are not entries under a key: every
// operation fails with an error (not ErrNotOwner, not a panic) and leaves
// the value alone.
func TestCorruptValue(t *testing.T) {
	each(t, func(t *testing.T, rdb *redis.Client, _ *miniredis.Miniredis) {
		ctx := t.Context()
		p := prefix("corrupt")
		s := redisstore.New(rdb, redisstore.WithPrefix(p))
		for _, v := range []string{
			"", "garbage", "D", "P", "P\x00", "P\x02fp", "X\x00abc", "D\x09short", "\x00\x00",
			"I", "I0", "I01", "I-5", "I5x", "I 5", "I1.5", "I1e3", "I1234567890123456", "i5",
			"Q", "Q\x00", "Q\x00\x00o", "Q\x00\x015", "Q\x00\x025", "Q\x02fp\x025o", "Q\x00\x010o", "Q\x00\x02x1o",
			"Q\x09short", "Q\x00\x00", "Q\x00\x1012345678901234567o",
			"C", "C\x00", "C\x02fp", "C\x09short", "C\x00\x00", "C\x00\x00rec", "C\x00\x80\x00o", "C\x00\x05own",
			"C\x02fp\x80", "C\x00\x81", "C\x00\xff\xff\xff\xff\xff\x01o", "C\x00\x80\x01" + strings.Repeat("o", 127),
			// Stamps: malformed, or over a value that is not an entry
			// (a 'D' entry is never stamped).
			"T", "T\x00", "T123456", "T\x00\x00\x00\x00\x00P\x00o", "T123456garbage", "T123456D\x00r",
			"T123456T123456P\x00o", "T123456P\x00", "T123456C\x00\x00", "T123456I", "T123456Q\x00\x00o",
		} {
			if err := rdb.Set(ctx, p+"bad", v, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			for name, f := range map[string]func() error{
				"acquire":  func() error { _, err := s.Acquire(ctx, "bad", "o", "", time.Minute); return err },
				"complete": func() error { return s.Complete(ctx, "bad", "o", []byte("r"), time.Minute) },
				"release":  func() error { return s.Release(ctx, "bad", "o") },
				"extend":   func() error { return s.Extend(ctx, "bad", "o", time.Minute) },
				"issue":    func() error { return s.Issue(ctx, "bad", time.Minute) },
				"acquire issued": func() error {
					_, err := s.AcquireIssued(ctx, "bad", "o", "", time.Minute)
					return err
				},
			} {
				err := f()
				if err == nil || errors.Is(err, storage.ErrNotOwner) || !strings.Contains(err.Error(), "not an idem entry") {
					t.Errorf("%s over %q: %v, want an error saying the value is not an entry", name, v, err)
				}
			}
			if got := rdb.Get(ctx, p+"bad").Val(); got != v {
				t.Errorf("value %q changed to %q", v, got)
			}
		}

		// A key of another type: Redis's own WRONGTYPE error.
		rdb.Del(ctx, p+"bad")
		rdb.HSet(ctx, p+"bad", "f", "v")
		if _, err := s.Acquire(ctx, "bad", "o", "", time.Minute); err == nil || errors.Is(err, storage.ErrNotOwner) {
			t.Errorf("Acquire over a hash: %v, want an error", err)
		}
		if err := s.Release(ctx, "bad", "o"); err == nil || errors.Is(err, storage.ErrNotOwner) {
			t.Errorf("Release over a hash: %v, want an error", err)
		}
	})
}

// TestScriptsAreSafeToRunTwice sends each script twice, as go-redis does
// when it retries after a read timeout, from two clients at once.
func TestScriptsAreSafeToRunTwice(t *testing.T) {
	each(t, func(t *testing.T, rdb *redis.Client, _ *miniredis.Miniredis) {
		ctx := t.Context()
		s := redisstore.New(rdb, redisstore.WithPrefix(prefix("twice")))
		twice := func(what string, f func() error) {
			t.Helper()
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i := range errs {
				wg.Go(func() { errs[i] = f() })
			}
			wg.Wait()
			if errs[0] != nil || errs[1] != nil {
				t.Fatalf("%s sent twice: %v, %v", what, errs[0], errs[1])
			}
		}
		twice("acquire", func() error {
			res, err := s.Acquire(ctx, "k", "o", "fp", time.Minute)
			if err == nil && res.State != storage.Acquired {
				return errors.New(res.State.String())
			}
			return err
		})
		twice("extend", func() error { return s.Extend(ctx, "k", "o", time.Minute) })
		twice("complete", func() error { return s.Complete(ctx, "k", "o", []byte("r"), time.Minute) })
		s.Acquire(ctx, "k2", "o", "fp", time.Minute)
		twice("release", func() error { return s.Release(ctx, "k2", "o") })
		if err := s.Issue(ctx, "i", time.Minute); err != nil {
			t.Fatal(err)
		}
		twice("acquire issued", func() error {
			res, err := s.AcquireIssued(ctx, "i", "o", "fp", time.Minute)
			if err == nil && res.State != storage.Acquired {
				return errors.New(res.State.String())
			}
			return err
		})
		twice("release to issued", func() error { return s.Release(ctx, "i", "o") })
		if err := s.Issue(ctx, "i", time.Minute); !errors.Is(err, storage.ErrExists) {
			t.Fatalf("Issue after the release: %v, want ErrExists (issued again)", err)
		}
	})
}

// argsHook records every command as hooks that format commands (tracing,
// logging) print it.
type argsHook struct {
	mu   sync.Mutex
	cmds []string
}

func (h *argsHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *argsHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *argsHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.mu.Lock()
		h.cmds = append(h.cmds, cmd.String())
		h.mu.Unlock()
		return err
	}
}

// TestCommandsPrintTheirArguments checks that the EVALSHA commands the
// store builds print with every argument as its value (not a pointer) in
// hooks, and that the scripts fall back to EVAL with the same arguments.
func TestCommandsPrintTheirArguments(t *testing.T) {
	each(t, func(t *testing.T, rdb *redis.Client, _ *miniredis.Miniredis) {
		ctx := t.Context()
		h := new(argsHook)
		rdb.AddHook(h)
		p := prefix("args")
		s := redisstore.New(rdb, redisstore.WithPrefix(p))
		if _, err := s.Acquire(ctx, "k", "owner-1", "fp-1", 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, "k", "owner-1", []byte("the-record"), time.Hour); err != nil {
			t.Fatal(err)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		// On miniredis the scripts are not cached yet: EVALSHA fails with
		// NOSCRIPT and EVAL follows, and both must print the arguments.
		for _, want := range []string{" 1 " + p + "k owner-1 fp-1 30000", " 1 " + p + "k owner-1 the-record 3600000"} {
			found := false
			for _, c := range h.cmds {
				found = found || (strings.HasPrefix(c, "evalsha ") && strings.Contains(c, want))
			}
			if !found {
				t.Errorf("no evalsha printed with %q in %q", want, h.cmds)
			}
		}
		for _, c := range h.cmds {
			if strings.Contains(c, "0xc") {
				t.Errorf("command %q prints a pointer", c)
			}
		}
	})
}

// TestCompleteChecksTheOwnerOfADoneEntry: A's lease runs out while its
// handler runs, B acquires the key, runs and completes it with record R;
// A then completes with the very same R. That is a second execution, not
// a resend: A gets ErrNotOwner and the entry is left as B wrote it. B's
// resend of its Complete is still nil.
func TestCompleteChecksTheOwnerOfADoneEntry(t *testing.T) {
	each(t, func(t *testing.T, rdb *redis.Client, mr *miniredis.Miniredis) {
		ctx := t.Context()
		p := prefix("owner")
		s := redisstore.New(rdb, redisstore.WithPrefix(p))
		if res, err := s.Acquire(ctx, "k", "A", "fp", 20*time.Millisecond); err != nil || res.State != storage.Acquired {
			t.Fatalf("A acquires: %+v, %v", res, err)
		}
		// A's lease runs out.
		if mr != nil {
			mr.FastForward(21 * time.Millisecond)
		} else {
			time.Sleep(25 * time.Millisecond)
		}
		if res, err := s.Acquire(ctx, "k", "B", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatalf("B acquires after A's lease ran out: %+v, %v", res, err)
		}
		rec := []byte("R: the same response")
		if err := s.Complete(ctx, "k", "B", rec, time.Hour); err != nil {
			t.Fatalf("B completes: %v", err)
		}
		before := rdb.Get(ctx, p+"k").Val()
		if mr != nil {
			mr.FastForward(time.Minute) // a TTL rewritten would show
		}
		ttl := rdb.PTTL(ctx, p+"k").Val()
		if err := s.Complete(ctx, "k", "A", rec, 2*time.Hour); !errors.Is(err, storage.ErrNotOwner) {
			t.Errorf("A completes with B's very record: %v, want ErrNotOwner (A ran a second time)", err)
		}
		if err := s.Complete(ctx, "k", "A", []byte("R2"), 2*time.Hour); !errors.Is(err, storage.ErrNotOwner) {
			t.Errorf("A completes with another record: %v, want ErrNotOwner", err)
		}
		if err := s.Complete(ctx, "k", "B", []byte("R2"), 2*time.Hour); !errors.Is(err, storage.ErrNotOwner) {
			t.Errorf("B completes again with another record: %v, want ErrNotOwner", err)
		}
		if err := s.Complete(ctx, "k", "B", rec, 2*time.Hour); err != nil {
			t.Errorf("B's resend: %v, want nil", err)
		}
		if after := rdb.Get(ctx, p+"k").Val(); after != before {
			t.Errorf("entry changed from %q to %q", before, after)
		}
		if d := rdb.PTTL(ctx, p+"k").Val(); d > ttl {
			t.Errorf("PTTL %v after the refused completes, was %v: the TTL was renewed", d, ttl)
		}
		if res, err := s.Acquire(ctx, "k", "C", "fp", time.Minute); err != nil || res.State != storage.Done || string(res.Record) != string(rec) || res.Fingerprint != "fp" {
			t.Errorf("acquire after: %+v, %v; want done with B's record", res, err)
		}
		for name, f := range map[string]func() error{
			"release by B": func() error { return s.Release(ctx, "k", "B") },
			"extend by B":  func() error { return s.Extend(ctx, "k", "B", time.Minute) },
		} {
			if err := f(); !errors.Is(err, storage.ErrNotOwner) {
				t.Errorf("%s of the done entry: %v, want ErrNotOwner", name, err)
			}
		}
		if err := s.Issue(ctx, "k", time.Minute); !errors.Is(err, storage.ErrExists) {
			t.Errorf("issue over the done entry: %v, want ErrExists", err)
		}
	})
}

// TestOldDoneEntry: a done entry in the layout of the previous release
// ('D', the fingerprint's length, the fingerprint, the record: no owner),
// as a process of that release writes it during a rolling deploy, is
// replayed. Complete cannot prove that its owner wrote it, so it answers
// ErrNotOwner even with the same record, and changes nothing.
func TestOldDoneEntry(t *testing.T) {
	each(t, func(t *testing.T, rdb *redis.Client, _ *miniredis.Miniredis) {
		ctx := t.Context()
		p := prefix("old")
		s := redisstore.New(rdb, redisstore.WithPrefix(p))
		for _, c := range []struct{ value, fp, rec string }{
			{"D\x02fprecord", "fp", "record"},
			{"D\x00", "", ""},
			{"D\x00\x00\x01C\x05", "", "\x00\x01C\x05"}, // a record that looks like a new entry's tail
			{"D\x03abc", "abc", ""},
		} {
			if err := rdb.Set(ctx, p+"k", c.value, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			res, err := s.Acquire(ctx, "k", "o", "x", time.Minute)
			if err != nil || res.State != storage.Done || res.Fingerprint != c.fp || string(res.Record) != c.rec {
				t.Errorf("acquire over %q: %+v, %v; want done, fingerprint %q, record %q", c.value, res, err, c.fp, c.rec)
			}
			res, err = s.AcquireIssued(ctx, "k", "o", "x", time.Minute)
			if err != nil || res.State != storage.Done || res.Fingerprint != c.fp || string(res.Record) != c.rec {
				t.Errorf("acquire issued over %q: %+v, %v; want done", c.value, res, err)
			}
			if err := s.Complete(ctx, "k", "o", []byte(c.rec), time.Minute); !errors.Is(err, storage.ErrNotOwner) {
				t.Errorf("complete with the same record over %q: %v, want ErrNotOwner", c.value, err)
			}
			if err := s.Release(ctx, "k", "o"); !errors.Is(err, storage.ErrNotOwner) {
				t.Errorf("release over %q: %v, want ErrNotOwner", c.value, err)
			}
			if err := s.Extend(ctx, "k", "o", time.Minute); !errors.Is(err, storage.ErrNotOwner) {
				t.Errorf("extend over %q: %v, want ErrNotOwner", c.value, err)
			}
			if err := s.Issue(ctx, "k", time.Minute); !errors.Is(err, storage.ErrExists) {
				t.Errorf("issue over %q: %v, want ErrExists", c.value, err)
			}
			if got := rdb.Get(ctx, p+"k").Val(); got != c.value {
				t.Errorf("value %q changed to %q", c.value, got)
			}
			if d := rdb.PTTL(ctx, p+"k").Val(); d <= 59*time.Minute {
				t.Errorf("PTTL %v, want the hour it was set with", d)
			}
		}
	})
}

// nilHook answers every command with redis.Nil, which no script answers.
type nilHook struct{}

func (nilHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (nilHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (nilHook) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		cmd.SetErr(redis.Nil)
		return redis.Nil
	}
}

// TestNilReplyIsNotAnEntry: a nil reply (redis.Nil) must not pass for "no
// entry": every operation fails with an unexpected reply.
func TestNilReplyIsNotAnEntry(t *testing.T) {
	rdb := client(t, miniredis.RunT(t).Addr())
	rdb.AddHook(nilHook{})
	s := redisstore.New(rdb, redisstore.WithEvictionAllowed())
	ctx := t.Context()
	_, errAcquire := s.Acquire(ctx, "k", "o", "fp", time.Minute)
	_, errLookup := s.Lookup(ctx, "k", false)
	for name, err := range map[string]error{
		"acquire":  errAcquire,
		"complete": s.Complete(ctx, "k", "o", []byte("r"), time.Minute),
		"release":  s.Release(ctx, "k", "o"),
		"issue":    s.Issue(ctx, "k", time.Minute),
		"lookup":   errLookup,
	} {
		if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, storage.ErrNotFound) || !strings.Contains(err.Error(), "unexpected reply") {
			t.Errorf("%s on a nil reply: %v, want an unexpected reply", name, err)
		}
	}
}
