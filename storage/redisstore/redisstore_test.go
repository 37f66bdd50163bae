package redisstore_test

import (
	"context"
	"crypto/rand"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/internal/redisproto"
	"github.com/idemkit/idem/storage/internal/redisproto/redisprototest"
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
	// Valkey 8.1 and newer: the native path (SET IFEQ). Skipped without a
	// valkey-server, unless IDEM_REQUIRE_VALKEY=1 (as in CI).
	{"valkey", func(t *testing.T) (*redis.Client, *miniredis.Miniredis) {
		return client(t, redistest.ValkeyAddr(t)), nil
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

// storeMax is the WithMaxRecordBytes of the contract suite's stores.
const storeMax = 1<<20 + 1024

func TestContractMiniredis(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		mr := miniredis.RunT(t)
		// Advance moves both clocks of miniredis, the TTLs' and TIME's,
		// and the store's, which stamps entries (read by its policy
		// check's goroutine too: atomic).
		var now atomic.Int64
		now.Store(time.Now().UnixNano())
		mr.SetTime(time.Unix(0, now.Load()))
		advance := func(d time.Duration) {
			mr.SetTime(time.Unix(0, now.Add(int64(d))))
			mr.FastForward(d)
		}
		s := redisstore.New(client(t, mr.Addr()), redisstore.WithMaxRecordBytes(storeMax))
		redisstore.SetClock(s, func() time.Time { return time.Unix(0, now.Load()) })
		return storagetest.Harness{Store: s, Advance: advance, MaxRecord: storeMax}
	})
}

func TestContractRedis(t *testing.T) {
	rdb := client(t, redistest.Addr(t))
	s := redisstore.New(rdb, redisstore.WithPrefix(prefix("contract")), redisstore.WithMaxRecordBytes(storeMax))
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: s, MaxRecord: storeMax}
	})
}

// TestContractValkey runs the suite on Valkey, where Complete and Extend
// take the native path (SET IFEQ).
func TestContractValkey(t *testing.T) {
	s := redisstore.New(client(t, redistest.ValkeyAddr(t)), redisstore.WithPrefix(prefix("contract")), redisstore.WithMaxRecordBytes(storeMax))
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: s, MaxRecord: storeMax}
	})
}

// TestContractRedisCluster runs the suite through a redis.ClusterClient on
// a real cluster of three masters: each script routes by KEYS[1], and the
// suite's random keys land on every master.
func TestContractRedisCluster(t *testing.T) {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	s := redisstore.New(rdb, redisstore.WithPrefix(prefix("cluster")), redisstore.WithMaxRecordBytes(storeMax))
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: s, MaxRecord: storeMax}
	})
}

// protocolHarness is the harness of the protocol's suite on rdb; mr, when
// not nil, is rdb's server, of the test's own, whose clock the suite sets.
func protocolHarness(rdb *redis.Client, mr *miniredis.Miniredis) redisprototest.Harness {
	var clock atomic.Pointer[time.Time] // the stores' clock once SetTime set it
	h := redisprototest.Harness{
		New: func(prefix string) redisprototest.Store {
			s := redisstore.New(rdb)
			if prefix != "" {
				s = redisstore.New(rdb, redisstore.WithPrefix(prefix))
			}
			if mr != nil {
				redisstore.SetClock(s, func() time.Time {
					if t := clock.Load(); t != nil {
						return *t
					}
					return time.Now()
				})
			}
			return s
		},
		Do: func(ctx context.Context, args ...string) (redisproto.Reply, error) {
			v, err := rdb.Do(ctx, anySlice(args)...).Result()
			if errors.Is(err, redis.Nil) {
				return redisproto.Reply{}, nil
			}
			return redisproto.FromAny(v), err
		},
	}
	h.NewScripts = func(prefix string) redisprototest.Store {
		return redisstore.ScriptsOnly(h.New(prefix).(*redisstore.Store))
	}
	if mr != nil {
		h.SetTime = func(t time.Time) {
			clock.Store(&t)
			mr.SetTime(t)
		}
	}
	return h
}

// anySlice returns args as a slice of any, as go-redis's Do takes them.
func anySlice(args []string) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = a
	}
	return out
}

// TestProtocol runs the protocol's suite (redisprototest) through
// go-redis on every backend.
func TestProtocol(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			redisprototest.Run(t, func(t *testing.T) redisprototest.Harness { return protocolHarness(b.open(t)) })
		})
	}
}

// TestOneRoundTripEach counts the commands each operation sends, once the
// scripts are cached: exactly one, but the Acquires of
// redisprototest.Commands (a SET NX GET that found an entry in flight, or
// one to take, and the command after it). After SCRIPT FLUSH, the first
// run of each script costs one more (EVALSHA answered NOSCRIPT, then
// EVAL) and works. The first operation of each store costs one more, the
// INFO that checks the maxmemory-policy and the version, and no later one
// does (the verdict stands for PolicyCheckEvery, far longer than the
// test).
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
			for i, o := range redisprototest.Outcomes {
				c.Reset()
				if err := o.Run(ctx, s); err != nil {
					t.Fatalf("%s: %s: %v", pass, o.Name, err)
				}
				if n := c.Count(); n != want(i) {
					t.Errorf("%s: %s took %d round trips, want %d", pass, o.Name, n, want(i))
				}
			}
		}
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		native := redisprototest.Native(ctx, protocolHarness(rdb, nil).Do)
		base := func(i int) int64 {
			n, _ := redisprototest.Sends(i, native)
			if i == 0 {
				n++ // INFO, the policy's and version's check
			}
			return n
		}
		run("scripts not cached", redisstore.New(rdb, redisstore.WithPrefix(prefix("flush"))), func(i int) int64 {
			if _, first := redisprototest.Sends(i, native); first {
				return base(i) + 1
			}
			return base(i)
		})
		run("scripts cached", redisstore.New(rdb, redisstore.WithPrefix(prefix("rt"))), base)
		run("scripts cached, policy known", redisstore.New(rdb, redisstore.WithPrefix(prefix("rt2")), redisstore.WithEvictionAllowed()),
			func(i int) int64 { n, _ := redisprototest.Sends(i, native); return n })
	})
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
	// Within a second, however late a loaded machine fires its timers.
	took, late := timed(func() { _, err = s.Acquire(ctx, "k", "o", "", time.Minute) })
	if err == nil || took > time.Second+late {
		t.Fatalf("Acquire on a stalled server: %v after %v (timers %v late), want an error by the 100ms deadline", err, took, late)
	}
	if errors.Is(err, storage.ErrNotOwner) || errors.Is(err, storage.ErrInvalid) {
		t.Fatalf("Acquire on a stalled server: %v", err)
	}
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

// TestCommandsPrintTheirArguments checks that the commands the store
// builds (Acquire's SET, Complete's EVALSHA) print with every argument as
// its value (not a pointer) in hooks, and that the scripts fall back to
// EVAL with the same arguments.
func TestCommandsPrintTheirArguments(t *testing.T) {
	each(t, func(t *testing.T, rdb *redis.Client, _ *miniredis.Miniredis) {
		ctx := t.Context()
		native := redisprototest.Native(ctx, protocolHarness(rdb, nil).Do)
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
		// Complete is the native path's first command, refused where the
		// server has no SET IFEQ, and the script follows.
		wants := []struct{ cmd, args string }{
			{"set ", "set " + p + "k T"},
			{"set ", "P\x04fp-1owner-1 nx px 30000 get"},
			{"set ", "C\x04fp-1\aowner-1the-record ifeq T"},
		}
		if !native {
			wants = append(wants, struct{ cmd, args string }{"evalsha ", " 1 " + p + "k owner-1 the-record 3600000 "})
		}
		for _, want := range wants {
			found := false
			for _, c := range h.cmds {
				found = found || (strings.HasPrefix(c, want.cmd) && strings.Contains(c, want.args))
			}
			if !found {
				t.Errorf("no %sprinted with %q in %q", want.cmd, want.args, h.cmds)
			}
		}
		for _, c := range h.cmds {
			if strings.Contains(c, "0xc") {
				t.Errorf("command %q prints a pointer", c)
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

// TestNilReplyIsNotAnEntry: a nil reply (redis.Nil) to a script must not
// pass for "no entry": every operation that runs one fails with an
// unexpected reply. (Acquire's SET NX GET answers nil when there was no
// entry and it made one: there, nil is the answer.)
func TestNilReplyIsNotAnEntry(t *testing.T) {
	rdb := client(t, miniredis.RunT(t).Addr())
	rdb.AddHook(nilHook{})
	s := redisstore.New(rdb, redisstore.WithEvictionAllowed())
	ctx := t.Context()
	_, errAcquire := s.AcquireIssued(ctx, "k", "o", "fp", time.Minute)
	_, errLookup := s.Lookup(ctx, "k", false)
	for name, err := range map[string]error{
		"acquire issued": errAcquire,
		"complete":       s.Complete(ctx, "k", "o", []byte("r"), time.Minute),
		"release":        s.Release(ctx, "k", "o"),
		"issue":          s.Issue(ctx, "k", time.Minute),
		"lookup":         errLookup,
	} {
		if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, storage.ErrNotFound) || !strings.Contains(err.Error(), "unexpected reply") {
			t.Errorf("%s on a nil reply: %v, want an unexpected reply", name, err)
		}
	}
}
