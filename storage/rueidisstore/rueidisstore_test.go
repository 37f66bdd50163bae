package rueidisstore_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strconv"
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
	"github.com/idemkit/idem/storage/rueidisstore"
	"github.com/idemkit/idem/storage/storagetest"
	"github.com/redis/rueidis"
)

// Main stops the shared redis-servers and checks for leaked goroutines.
func TestMain(m *testing.M) { leakcheck.Main(redistest.Wrap(m)) }

// backend is a Redis to run a test on: miniredis, or a real server.
type backend struct {
	name string
	// open returns a client and, for miniredis, the server.
	open func(t *testing.T) (rueidis.Client, *miniredis.Miniredis)
}

var backends = []backend{
	{"miniredis", func(t *testing.T) (rueidis.Client, *miniredis.Miniredis) {
		mr := miniredis.RunT(t)
		return client(t, mr.Addr()), mr
	}},
	{"redis", func(t *testing.T) (rueidis.Client, *miniredis.Miniredis) {
		return client(t, redistest.Addr(t)), nil
	}},
	// Valkey 8.1 and newer: the native path (SET IFEQ). Skipped without a
	// valkey-server, unless IDEM_REQUIRE_VALKEY=1 (as in CI).
	{"valkey", func(t *testing.T) (rueidis.Client, *miniredis.Miniredis) {
		return client(t, redistest.ValkeyAddr(t)), nil
	}},
}

// client returns a client of the test's own for addrs, with the options
// of ClientOption (one resend, a dial that gives up after 250 ms), but a
// connection given up after seconds of silence, not 250 ms: a loaded
// machine (CI, two shared cores, -race, miniredis building a Lua state
// for each script) may keep one silent that long.
func client(t testing.TB, addrs ...string) rueidis.Client {
	t.Helper()
	opt := rueidisstore.ClientOption(addrs...)
	opt.Dialer.KeepAlive, opt.ConnWriteTimeout = time.Second, 10*time.Second
	opt.Dialer.Timeout = 10 * time.Second // rueidis bounds a new connection's handshake (HELLO) by it too
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// prefix returns a prefix no other test uses, for tests on a shared server.
func prefix(name string) string { return "test:" + name + ":" + rand.Text()[:8] + ":" }

// do sends a command built from args and fails the test on an error.
func do(t testing.TB, c rueidis.Client, args ...string) rueidis.RedisMessage {
	t.Helper()
	m, err := c.Do(t.Context(), c.B().Arbitrary(args...).Build()).ToMessage()
	if err != nil && !rueidis.IsRedisNil(err) {
		t.Fatalf("%q: %v", args, err)
	}
	return m
}

// get returns the value of key, "" when there is none.
func get(t testing.TB, c rueidis.Client, key string) string {
	t.Helper()
	m := do(t, c, "GET", key)
	v, _ := m.ToString()
	return v
}

// TestContractMiniredis runs the suite on miniredis, whose clocks move.
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
		s := rueidisstore.New(client(t, mr.Addr()), rueidisstore.WithMaxRecordBytes(storeMax))
		rueidisstore.SetClock(s, func() time.Time { return time.Unix(0, now.Load()) })
		return storagetest.Harness{Store: s, Advance: advance, MaxRecord: storeMax}
	})
}

// TestContractRedis runs the suite on a real server, whose clock cannot
// be moved: Advance is nil, and the expiry clauses wait.
func TestContractRedis(t *testing.T) {
	s := rueidisstore.New(client(t, redistest.Addr(t)), rueidisstore.WithPrefix(prefix("contract")), rueidisstore.WithMaxRecordBytes(storeMax))
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: s, MaxRecord: storeMax}
	})
}

// TestContractValkey runs the suite on Valkey, where Complete and Extend
// take the native path (SET IFEQ).
func TestContractValkey(t *testing.T) {
	s := rueidisstore.New(client(t, redistest.ValkeyAddr(t)), rueidisstore.WithPrefix(prefix("contract")), rueidisstore.WithMaxRecordBytes(storeMax))
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: s, MaxRecord: storeMax}
	})
}

// TestContractRedisCluster runs the suite through rueidis's cluster client
// on a real cluster of three masters: each script routes by KEYS[1], and
// the suite's random keys land on every master.
func TestContractRedisCluster(t *testing.T) {
	c := client(t, redistest.ClusterAddrs(t)...)
	if m := c.Mode(); m != rueidis.ClientModeCluster {
		t.Fatalf("client mode %s, want cluster", m)
	}
	s := rueidisstore.New(c, rueidisstore.WithPrefix(prefix("cluster")), rueidisstore.WithMaxRecordBytes(storeMax))
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: s, MaxRecord: storeMax}
	})
}

// protocolHarness is the harness of the protocol's suite on c; mr, when
// not nil, is c's server, of the test's own, whose clock the suite sets.
func protocolHarness(c rueidis.Client, mr *miniredis.Miniredis) redisprototest.Harness {
	var clock atomic.Pointer[time.Time] // the stores' clock once SetTime set it
	h := redisprototest.Harness{
		New: func(prefix string) redisprototest.Store {
			s := rueidisstore.New(c)
			if prefix != "" {
				s = rueidisstore.New(c, rueidisstore.WithPrefix(prefix))
			}
			if mr != nil {
				rueidisstore.SetClock(s, func() time.Time {
					if t := clock.Load(); t != nil {
						return *t
					}
					return time.Now()
				})
			}
			return s
		},
		Do: func(ctx context.Context, args ...string) (redisproto.Reply, error) {
			v, err := c.Do(ctx, c.B().Arbitrary(args...).Build()).ToAny()
			if rueidis.IsRedisNil(err) {
				return redisproto.Reply{}, nil
			}
			return redisproto.FromAny(v), err
		},
	}
	h.NewScripts = func(prefix string) redisprototest.Store {
		return rueidisstore.ScriptsOnly(h.New(prefix).(*rueidisstore.Store))
	}
	if mr != nil {
		h.SetTime = func(t time.Time) {
			clock.Store(&t)
			mr.SetTime(t)
		}
	}
	return h
}

// TestProtocol runs the protocol's suite (redisprototest) through
// rueidis on every backend.
func TestProtocol(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			redisprototest.Run(t, func(t *testing.T) redisprototest.Harness { return protocolHarness(b.open(t)) })
		})
	}
}

// everyOutcome walks every outcome of every operation, and then looks
// the entries up, lists them and removes one.
var everyOutcome = slices.Concat(redisprototest.Outcomes, redisprototest.Inspections, []redisprototest.Op{
	{Name: "remove", Run: func(ctx context.Context, s redisprototest.Store) error {
		// One script whatever it answers; storagetest checks the removals.
		if _, err := s.Remove(ctx, "k", "not-its-version"); !errors.Is(err, storage.ErrChanged) {
			return fmt.Errorf("Remove with a stale version: %v, want ErrChanged", err)
		}
		return nil
	}},
})

// sends returns how many commands everyOutcome[i] sends once the scripts
// are cached and the policy known, on a server with the native path
// (native) or without (see redisprototest.Sends), and whether it is the
// first use of a script: acquire (by a resent Acquire, after its SET NX
// GET), extend (after the native path's probe, or natively), release,
// complete, issue, acquire issued, inspect (lookup). List's pipeline
// (a SCAN, then the look-ups of its two keys) and remove find the inspect
// script cached.
func sends(i int, native bool) (n int64, first bool) {
	switch o := len(redisprototest.Outcomes); {
	case i < o:
		return redisprototest.Sends(i, native)
	case everyOutcome[i].Name == "list":
		return 3, false
	default:
		return 1, i == o
	}
}

// native reports whether the server behind c takes SET IFEQ.
func native(t testing.TB, c rueidis.Client) bool {
	return redisprototest.Native(t.Context(), protocolHarness(c, nil).Do)
}

// storeCommands are the commands the store sends, but those that a
// script calls too (SET, PTTL).
var storeCommands = []string{"evalsha", "eval", "info", "scan", "cluster|slots"}

// commandStats reads the calls of the store's commands from the server's
// INFO commandstats, through a connection of its own; the INFO it sends
// counts one more "info" in the next read.
func commandStats(t testing.TB, admin rueidis.Client) map[string]int64 {
	t.Helper()
	info, err := admin.Do(t.Context(), admin.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	stats := map[string]int64{}
	for line := range strings.Lines(info) {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found {
			continue
		}
		for f := range strings.SplitSeq(fields, ",") {
			// calls counts the calls that ran, those that failed among
			// them (NOSCRIPT, on Redis 7.0); rejected_calls those refused
			// before they ran.
			if k, v, _ := strings.Cut(f, "="); k == "calls" || k == "rejected_calls" {
				n, _ := strconv.ParseInt(v, 10, 64)
				stats[name] += n
			}
		}
	}
	return stats
}

// serverCounter counts, on the server, the commands a store sends.
type serverCounter struct {
	t     testing.TB
	admin rueidis.Client
	last  map[string]int64
}

// newServerCounter returns a counter of the commands the server at addr
// runs from now on.
func newServerCounter(t testing.TB, addr string) *serverCounter {
	admin := client(t, addr)
	return &serverCounter{t: t, admin: admin, last: commandStats(t, admin)}
}

// count returns the commands of the store the server ran since the last
// count, by name, and their total.
func (c *serverCounter) count() (map[string]int64, int64) {
	c.t.Helper()
	now := commandStats(c.t, c.admin)
	now["info"]-- // the read before this one
	diff, total := map[string]int64{}, int64(0)
	for _, name := range storeCommands {
		if d := now[name] - c.last[name]; d != 0 {
			diff[name], total = d, total+d
		}
	}
	now["info"]++
	c.last = now
	return diff, total
}

// clientCounter is a client that counts the commands sent through it, or
// through one of its nodes, by name ("evalsha", "cluster|slots"). The
// server's own count (INFO commandstats) would count the commands a
// script calls too (SET, PTTL), which Acquire also sends itself.
type clientCounter struct {
	rueidis.Client
	mu    *sync.Mutex
	names map[string]int64
	last  map[string]int64
}

func newClientCounter(c rueidis.Client) *clientCounter {
	return &clientCounter{Client: c, mu: new(sync.Mutex), names: map[string]int64{}, last: map[string]int64{}}
}

func (c *clientCounter) add(cmd rueidis.Completed) {
	args := cmd.Commands()
	if len(args) == 0 {
		return
	}
	name := strings.ToLower(args[0])
	if name == "cluster" && len(args) > 1 {
		name += "|" + strings.ToLower(args[1])
	}
	c.mu.Lock()
	c.names[name]++
	c.mu.Unlock()
}

// Do counts cmd and sends it.
func (c *clientCounter) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.add(cmd)
	return c.Client.Do(ctx, cmd)
}

// DoMulti counts each command and sends them.
func (c *clientCounter) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	for _, cmd := range cmds {
		c.add(cmd)
	}
	return c.Client.DoMulti(ctx, cmds...)
}

// Nodes returns the nodes, each counted here too.
func (c *clientCounter) Nodes() map[string]rueidis.Client {
	out := map[string]rueidis.Client{}
	for addr, n := range c.Client.Nodes() {
		out[addr] = &clientCounter{Client: n, mu: c.mu, names: c.names}
	}
	return out
}

// count returns the commands sent since the last count, by name, and
// their total.
func (c *clientCounter) count() (map[string]int64, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	diff, total := map[string]int64{}, int64(0)
	for name, n := range c.names {
		if d := n - c.last[name]; d != 0 {
			diff[name], total = d, total+d
		}
		c.last[name] = n
	}
	return diff, total
}

// TestOneRoundTripEach counts the commands each operation
// sends once the scripts are cached: exactly one, so one round trip, but
// the Acquires of redisprototest.Commands (a SET NX GET that found an
// entry in flight, or one to take, and the command after it); a List
// sends a SCAN, then the look-ups of the two keys it found in one
// pipeline (two round trips). After SCRIPT FLUSH, the first run of each
// script costs one more (EVALSHA answered NOSCRIPT, then EVAL) and
// works. The first operation of each store costs one more, the INFO that
// checks the maxmemory-policy and the version, and no later one does (the
// verdict stands for PolicyCheckEvery, far longer than the test).
func TestOneRoundTripEach(t *testing.T) {
	addr := redistest.Start(t)
	c := client(t, addr)
	ctx := t.Context()
	do(t, c, "PING") // sets up the connection
	counter := newClientCounter(c)
	run := func(pass string, s *rueidisstore.Store, want func(i int) int64) {
		t.Helper()
		for i, o := range everyOutcome {
			counter.count()
			if err := o.Run(ctx, s); err != nil {
				t.Fatalf("%s: %s: %v", pass, o.Name, err)
			}
			if got, n := counter.count(); n != want(i) {
				t.Errorf("%s: %s took %d commands (%v), want %d", pass, o.Name, n, got, want(i))
			}
		}
	}
	do(t, c, "SCRIPT", "FLUSH")
	nat := native(t, c)
	base := func(i int) int64 {
		n, _ := sends(i, nat)
		if i == 0 {
			n++ // INFO, the policy's and version's check
		}
		return n
	}
	run("scripts not cached", rueidisstore.New(counter, rueidisstore.WithPrefix(prefix("flush"))), func(i int) int64 {
		if _, first := sends(i, nat); first {
			return base(i) + 1
		}
		return base(i)
	})
	run("scripts cached", rueidisstore.New(counter, rueidisstore.WithPrefix(prefix("rt"))), base)
	run("scripts cached, policy known", rueidisstore.New(counter, rueidisstore.WithPrefix(prefix("rt2")), rueidisstore.WithEvictionAllowed()),
		func(i int) int64 {
			if i == 0 {
				return 1
			}
			return base(i)
		})
}

// TestScriptSHAs checks that rueidis calls each script by the digest
// redisproto gives it: once the server has each script under that digest
// (SCRIPT LOAD of its source answers it), every operation runs by EVALSHA
// alone, never NOSCRIPT then EVAL; so does List's pipeline, which names
// the digest itself.
func TestScriptSHAs(t *testing.T) {
	addr := redistest.Start(t)
	c := client(t, addr)
	do(t, c, "SCRIPT", "FLUSH")
	for _, sc := range []redisproto.Script{redisproto.Acquire, redisproto.AcquireIssued, redisproto.Issue,
		redisproto.Complete, redisproto.Release, redisproto.Extend, redisproto.Inspect} {
		m := do(t, c, "SCRIPT", "LOAD", sc.Src)
		if sha, _ := m.ToString(); sha != sc.SHA {
			t.Fatalf("SCRIPT LOAD answered %s, redisproto's digest is %s", sha, sc.SHA)
		}
	}
	counter := newClientCounter(c)
	s := rueidisstore.New(counter, rueidisstore.WithPrefix(prefix("sha")), rueidisstore.WithEvictionAllowed())
	for _, o := range everyOutcome {
		if err := o.Run(t.Context(), s); err != nil {
			t.Fatalf("%s: %v", o.Name, err)
		}
	}
	got, _ := counter.count()
	// One EVALSHA each, but Acquire's, which sends a SET (then an EVALSHA
	// or a PTTL, as redisprototest.Commands says), and List's look-ups of
	// its two keys.
	var sets, pttls, scripts int64
	if native(t, c) { // extend and complete: native
		sets, scripts = 2, -2
	} else { // the probe, refused
		sets = 1
	}
	for _, o := range everyOutcome {
		switch {
		case strings.HasPrefix(o.Name, "acquire") && !strings.HasPrefix(o.Name, "acquire issued"):
			sets++
			switch o.Name {
			case "acquire in flight":
				pttls++
			case "acquire again", "acquire takes issued":
				scripts++
			}
		default:
			scripts++
		}
	}
	if want := scripts + 1; got["evalsha"] != want || got["eval"] != 0 || got["set"] != sets || got["pttl"] != pttls {
		t.Fatalf("commands %v, want %d evalsha, %d set, %d pttl and no eval", got, want, sets, pttls)
	}
}

// TestServerErrors checks that a failing or unreachable server surfaces as
// an error that is neither ErrNotOwner nor ErrInvalid, from every
// operation, prefixed with the package's name and the operation's.
func TestServerErrors(t *testing.T) {
	mr := miniredis.RunT(t)
	s := rueidisstore.New(client(t, mr.Addr()))
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
		"lookup": func() error { _, err := s.Lookup(ctx, "k", false); return err },
		"remove": func() error { _, err := s.Remove(ctx, "k", "v"); return err },
		"list":   func() error { _, err := s.List(ctx, storage.Query{}); return err },
	}
	check := func(when string) {
		t.Helper()
		for name, f := range ops {
			err := f()
			if err == nil || errors.Is(err, storage.ErrNotOwner) || errors.Is(err, storage.ErrInvalid) ||
				errors.Is(err, storage.ErrNotFound) || !strings.HasPrefix(err.Error(), "rueidisstore: "+name) {
				t.Errorf("%s with %s: %v, want a rueidisstore error", name, when, err)
			}
		}
	}
	mr.SetError("LOADING Redis is loading the dataset in memory")
	check("an error from the server")
	mr.SetError("")
	mr.Close()
	check("the server closed")
}

// TestRecommendedOptionsFailFast checks ClientOption's promise on a real
// server: while it is stalled (SIGSTOP: connections are accepted, nothing
// is answered) an operation fails at its context's deadline, or within
// about a second without one; while it is down (killed), at once; and
// the client recovers without a restart when the server answers again.
func TestRecommendedOptionsFailFast(t *testing.T) {
	srv := redistest.StartProc(t)
	c, err := rueidis.NewClient(rueidisstore.ClientOption(srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s := rueidisstore.New(c)
	// acquire returns how long the Acquire took, and how late the
	// machine fired its timers meanwhile (see timed): each bound below
	// is widened by that much, so that it holds on a loaded machine.
	acquire := func(ctx context.Context, key string) (took, late time.Duration, err error) {
		took, late = timed(func() { _, err = s.Acquire(ctx, key, "o", "", time.Minute) })
		return took, late, err
	}
	wantFail := func(what string, took, late time.Duration, err error, within time.Duration) {
		t.Helper()
		if err == nil || took > within+late || errors.Is(err, storage.ErrNotOwner) || errors.Is(err, storage.ErrInvalid) {
			t.Fatalf("acquire %s: %v after %v (timers %v late), want an error within %v", what, err, took, late, within)
		}
		t.Logf("acquire %s failed after %v: %v", what, took.Round(time.Millisecond), err)
	}
	if _, _, err := acquire(t.Context(), "before"); err != nil { // the policy's verdict, and connections
		t.Fatal(err)
	}

	srv.Pause()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	took, late, err := acquire(ctx, "stalled-deadline")
	cancel()
	wantFail("with a 100ms deadline on a stalled server", took, late, err, time.Second)
	took, late, err = acquire(t.Context(), "stalled")
	wantFail("without a deadline on a stalled server", took, late, err, 2*time.Second)
	srv.Resume()
	deadline := time.Now().Add(10 * time.Second)
	for { // the server answers what it buffered, then new connections
		_, _, err := acquire(t.Context(), "resumed")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("acquire after SIGCONT: %v", err)
		}
		time.Sleep(5 * time.Millisecond) // another process: nothing to wait on but time
	}

	srv.Kill()
	took, late, err = acquire(t.Context(), "killed")
	wantFail("on a killed server", took, late, err, time.Second)
}

// nilClient answers every script with a nil reply, which no script gives.
type nilClient struct{ rueidis.Client }

// Do answers nil.
func (nilClient) Do(context.Context, rueidis.Completed) rueidis.RedisResult {
	return rueidis.NewErrorResult(rueidis.Nil)
}

// DoMulti answers nil to each command.
func (nilClient) DoMulti(_ context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	out := make([]rueidis.RedisResult, len(multi))
	for i := range out {
		out[i] = rueidis.NewErrorResult(rueidis.Nil)
	}
	return out
}

// TestNilReplyIsNotAnEntry: a nil reply to a script must not pass for "no
// entry": every operation that runs one fails with an unexpected reply.
// (Acquire's SET NX GET answers nil when there was no entry and it made
// one: there, nil is the answer.)
func TestNilReplyIsNotAnEntry(t *testing.T) {
	c := nilClient{client(t, miniredis.RunT(t).Addr())}
	s := rueidisstore.New(c, rueidisstore.WithEvictionAllowed())
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
		if err == nil || rueidis.IsRedisNil(err) || errors.Is(err, storage.ErrNotFound) || !strings.Contains(err.Error(), "unexpected reply") {
			t.Errorf("%s on a nil reply: %v, want an unexpected reply", name, err)
		}
	}
}

// TestRecordCopiedUntilWritten: Complete's context ends while its command
// waits, queued behind a large one, for a server that does not read
// (stalled); Complete returns, and its caller reuses the record's memory,
// as the middleware does. rueidis writes the queued command once the
// server reads again: the record stored must be the one Complete was
// given, not what the caller wrote over it since.
func TestRecordCopiedUntilWritten(t *testing.T) {
	srv := redistest.StartProc(t)
	opt := rueidisstore.ClientOption(srv.Addr())
	// One connection, whose commands all go through its queue, and which
	// outlives the stall.
	opt.PipelineMultiplex, opt.AlwaysPipelining = -1, true
	opt.ConnWriteTimeout, opt.Dialer.KeepAlive = time.Minute, time.Minute
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s := rueidisstore.New(c, rueidisstore.WithEvictionAllowed())
	ctx := t.Context()
	for _, k := range []string{"warm", "k"} {
		if res, err := s.Acquire(ctx, k, "o", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatalf("acquire %s: %+v, %v", k, res, err)
		}
	}
	// The script cached: the queued EVALSHA will find it.
	if err := s.Complete(ctx, "warm", "o", []byte("r"), time.Minute); err != nil {
		t.Fatal(err)
	}

	srv.Pause()
	// First in the queue, more than the sockets of a loopback connection
	// hold: the commands after it are written once the server reads.
	big := make([]byte, 32<<20)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err = c.Do(short, c.B().Set().Key("filler").Value(rueidis.BinaryString(big)).Build()).Error()
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("SET of 32 MiB to a stalled server: %v, want the context's deadline", err)
	}
	rec := []byte("the record of k")
	short, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
	err = s.Complete(short, "k", "o", rec, time.Minute)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("complete queued behind it: %v, want the context's deadline", err)
	}
	copy(rec, "XXXXXXXXXXXXXXX") // the caller reuses the buffer
	srv.Resume()
	deadline := time.Now().Add(10 * time.Second)
	for { // the queued command follows the large one
		e, err := s.Lookup(ctx, "k", true)
		if err != nil {
			t.Fatal(err)
		}
		if e.State == storage.Done {
			if string(e.Record) != "the record of k" {
				t.Fatalf("stored record %q, want the one given to Complete", e.Record)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queued complete never ran: %+v", e)
		}
		time.Sleep(10 * time.Millisecond) // the server's work: nothing to wait on but time
	}
}
