package rueidisstore_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/internal/redisproto"
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
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// prefix returns a prefix no other test uses, for tests on a shared server.
func prefix(name string) string { return "test:" + name + ":" + rand.Text()[:8] + ":" }

// each runs f on every backend, as a subtest of its own.
func each(t *testing.T, f func(t *testing.T, c rueidis.Client, mr *miniredis.Miniredis)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			c, mr := b.open(t)
			f(t, c, mr)
		})
	}
}

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

// pttl returns the PTTL of key.
func pttl(t testing.TB, c rueidis.Client, key string) time.Duration {
	t.Helper()
	m := do(t, c, "PTTL", key)
	n, err := m.ToInt64()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	return time.Duration(n) * time.Millisecond
}

// TestContractMiniredis runs the suite on miniredis, whose clocks move.
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
		return storagetest.Harness{Store: rueidisstore.New(client(t, mr.Addr())), Advance: advance}
	})
}

// TestContractRedis runs the suite on a real server, whose clock cannot
// be moved: Advance is nil, and the expiry clauses wait.
func TestContractRedis(t *testing.T) {
	s := rueidisstore.New(client(t, redistest.Addr(t)), rueidisstore.WithPrefix(prefix("contract")))
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: s}
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
	s := rueidisstore.New(c, rueidisstore.WithPrefix(prefix("cluster")))
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: s}
	})
}

// op is one store operation with the outcome it must have.
type op struct {
	name string
	run  func(ctx context.Context, s *rueidisstore.Store) error
}

// acquireOp acquires key for owner, and wants the state want.
func acquireOp(name, key, owner string, want storage.State) op {
	return op{name, func(ctx context.Context, s *rueidisstore.Store) error {
		res, err := s.Acquire(ctx, key, owner, "fp", time.Minute)
		if err == nil && res.State != want {
			return errors.New("state " + res.State.String() + ", want " + want.String())
		}
		return err
	}}
}

// acquireIssuedOp acquires the issued key for owner, and wants the state
// want.
func acquireIssuedOp(name, key, owner string, want storage.State) op {
	return op{name, func(ctx context.Context, s *rueidisstore.Store) error {
		res, err := s.AcquireIssued(ctx, key, owner, "fp", time.Minute)
		if err == nil && res.State != want {
			return errors.New("state " + res.State.String() + ", want " + want.String())
		}
		return err
	}}
}

// wantErr runs f, and wants an error wrapping want.
func wantErr(want error, f func(ctx context.Context, s *rueidisstore.Store) error) func(ctx context.Context, s *rueidisstore.Store) error {
	return func(ctx context.Context, s *rueidisstore.Store) error {
		if err := f(ctx, s); !errors.Is(err, want) {
			return errors.New("error " + errString(err) + ", want " + want.Error())
		}
		return nil
	}
}

// errString is err's text, "nil" for none.
func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// everyOutcome walks every outcome of every operation, and then looks
// the entries up and lists them.
var everyOutcome = []op{
	acquireOp("acquire new", "k", "o", storage.Acquired),
	acquireOp("acquire again", "k", "o", storage.Acquired),
	acquireOp("acquire in flight", "k", "o2", storage.InFlight),
	{"extend", func(ctx context.Context, s *rueidisstore.Store) error { return s.Extend(ctx, "k", "o", time.Minute) }},
	{"extend not owner", wantErr(storage.ErrNotOwner, func(ctx context.Context, s *rueidisstore.Store) error { return s.Extend(ctx, "k", "o2", time.Minute) })},
	{"release not owner", wantErr(storage.ErrNotOwner, func(ctx context.Context, s *rueidisstore.Store) error { return s.Release(ctx, "k", "o2") })},
	{"complete not owner", wantErr(storage.ErrNotOwner, func(ctx context.Context, s *rueidisstore.Store) error {
		return s.Complete(ctx, "k", "o2", []byte("rec"), time.Minute)
	})},
	{"complete", func(ctx context.Context, s *rueidisstore.Store) error {
		return s.Complete(ctx, "k", "o", []byte("rec"), time.Minute)
	}},
	{"complete resent", func(ctx context.Context, s *rueidisstore.Store) error {
		return s.Complete(ctx, "k", "o", []byte("rec"), time.Minute)
	}},
	acquireOp("acquire done", "k", "o2", storage.Done),
	acquireOp("acquire to release", "k2", "o", storage.Acquired),
	{"release", func(ctx context.Context, s *rueidisstore.Store) error { return s.Release(ctx, "k2", "o") }},
	{"release missing", func(ctx context.Context, s *rueidisstore.Store) error { return s.Release(ctx, "k2", "o") }},
	{"issue", func(ctx context.Context, s *rueidisstore.Store) error { return s.Issue(ctx, "i", time.Minute) }},
	{"issue exists", wantErr(storage.ErrExists, func(ctx context.Context, s *rueidisstore.Store) error { return s.Issue(ctx, "i", time.Minute) })},
	acquireIssuedOp("acquire issued, not issued", "never", "o", storage.NotIssued),
	acquireIssuedOp("acquire issued", "i", "o", storage.Acquired),
	acquireIssuedOp("acquire issued again", "i", "o", storage.Acquired),
	acquireIssuedOp("acquire issued in flight", "i", "o2", storage.InFlight),
	{"release to issued", func(ctx context.Context, s *rueidisstore.Store) error { return s.Release(ctx, "i", "o") }},
	{"release issued", func(ctx context.Context, s *rueidisstore.Store) error { return s.Release(ctx, "i", "o") }},
	{"extend issued", wantErr(storage.ErrNotOwner, func(ctx context.Context, s *rueidisstore.Store) error { return s.Extend(ctx, "i", "o", time.Minute) })},
	{"complete issued", wantErr(storage.ErrNotOwner, func(ctx context.Context, s *rueidisstore.Store) error {
		return s.Complete(ctx, "i", "o", []byte("rec"), time.Minute)
	})},
	acquireOp("acquire takes issued", "i", "o", storage.Acquired),
	{"complete taken from an issue", func(ctx context.Context, s *rueidisstore.Store) error {
		return s.Complete(ctx, "i", "o", []byte("rec"), time.Minute)
	}},
	acquireIssuedOp("acquire issued done", "i", "o2", storage.Done),
	{"lookup", func(ctx context.Context, s *rueidisstore.Store) error {
		e, err := s.Lookup(ctx, "k", true)
		if err == nil && (e.State != storage.Done || string(e.Record) != "rec") {
			return errors.New("entry " + e.State.String() + " " + string(e.Record) + ", want done with rec")
		}
		return err
	}},
	{"list", func(ctx context.Context, s *rueidisstore.Store) error {
		// One page on a server of a few keys; a shared one takes more.
		q, n := storage.Query{Limit: 1000}, 0
		for {
			page, err := s.List(ctx, q)
			if err != nil {
				return err
			}
			if n += len(page.Entries); page.Next == "" {
				break
			}
			q.Cursor = page.Next
		}
		if n != 2 {
			return errors.New("listed " + strconv.Itoa(n) + " entries, want k and i")
		}
		return nil
	}},
	{"remove", func(ctx context.Context, s *rueidisstore.Store) error {
		_, err := s.Remove(ctx, "k")
		return err
	}},
}

// firstUse is the index in everyOutcome of the first use of each script:
// acquire, extend, release, complete, issue, acquire issued, inspect
// (lookup). List's pipeline and remove find the inspect script cached.
var firstUse = map[int]bool{0: true, 3: true, 5: true, 6: true, 13: true, 15: true, 26: true}

// storeCommands are the commands the store sends.
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

// TestOneRoundTripEach counts, on the server, the commands each operation
// sends once the scripts are cached: exactly one, so one round trip; a
// List sends a SCAN, then the look-ups of the two keys it found in one
// pipeline (two round trips). After SCRIPT
// FLUSH, the first run of each script costs one more (EVALSHA answered
// NOSCRIPT, then EVAL) and works. The first operation of each store costs
// one more, the INFO memory that checks the maxmemory-policy, and no
// later one does (the verdict stands for PolicyCheckEvery, far longer
// than the test).
func TestOneRoundTripEach(t *testing.T) {
	addr := redistest.Start(t)
	c := client(t, addr)
	ctx := t.Context()
	do(t, c, "PING") // sets up the connection
	counter := newServerCounter(t, addr)
	run := func(pass string, s *rueidisstore.Store, want func(i int) int64) {
		t.Helper()
		for i, o := range everyOutcome {
			counter.count()
			if err := o.run(ctx, s); err != nil {
				t.Fatalf("%s: %s: %v", pass, o.name, err)
			}
			if got, n := counter.count(); n != want(i) {
				t.Errorf("%s: %s took %d commands (%v), want %d", pass, o.name, n, got, want(i))
			}
		}
	}
	do(t, c, "SCRIPT", "FLUSH")
	base := func(i int) int64 {
		n := int64(1)
		if everyOutcome[i].name == "list" {
			n = 3
		}
		if i == 0 {
			n++ // INFO memory
		}
		return n
	}
	run("scripts not cached", rueidisstore.New(c, rueidisstore.WithPrefix(prefix("flush"))), func(i int) int64 {
		if firstUse[i] {
			return base(i) + 1
		}
		return base(i)
	})
	run("scripts cached", rueidisstore.New(c, rueidisstore.WithPrefix(prefix("rt"))), base)
	run("scripts cached, policy known", rueidisstore.New(c, rueidisstore.WithPrefix(prefix("rt2")), rueidisstore.WithEvictionAllowed()),
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
	counter := newServerCounter(t, addr)
	s := rueidisstore.New(c, rueidisstore.WithPrefix(prefix("sha")), rueidisstore.WithEvictionAllowed())
	for _, o := range everyOutcome {
		if err := o.run(t.Context(), s); err != nil {
			t.Fatalf("%s: %v", o.name, err)
		}
	}
	got, _ := counter.count()
	// One EVALSHA each, and List's look-ups of its two keys.
	if want := int64(len(everyOutcome) + 1); got["evalsha"] != want || got["eval"] != 0 {
		t.Fatalf("commands %v, want %d evalsha and no eval", got, want)
	}
}

// TestKeysPrefixedWithTTL checks the layout byte for byte, as the store
// writes it through rueidis (the record, the lease and the TTL in
// milliseconds, rounded up), and that every key is under the prefix and
// has a TTL.
func TestKeysPrefixedWithTTL(t *testing.T) {
	mr := miniredis.RunT(t)
	c := client(t, mr.Addr())
	s := rueidisstore.New(c, rueidisstore.WithPrefix("app:"))
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
	rec := []byte{0, 1, 2}
	s.Complete(ctx, "k", "owner", rec, 36*time.Hour)
	rec[0] = 'x' // the caller reuses its buffer
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
	}{{127, "\x7f"}, {128, "\x80\x01"}, {16384, "\x80\x80\x01"}} {
		long := strings.Repeat("o", c.n)
		s.Acquire(ctx, "long", long, "fp", time.Minute)
		s.Complete(ctx, "long", long, []byte("r"), time.Hour)
		check("app:long", stamp(t0.Add(3*time.Second))+"C\x02fp"+c.len+long+"r", time.Hour)
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
	st = at(12 * time.Second)
	s.AcquireIssued(ctx, "i", "owner", "fp", 30*time.Second)
	check("app:i", st+"Q\x02fp\x075400000owner", 30*time.Second)
	s.Extend(ctx, "i", "owner", 1001*time.Microsecond) // rounded up
	check("app:i", st+"Q\x02fp\x075400000owner", 2*time.Millisecond)
	st = at(14 * time.Second)
	s.Release(ctx, "i", "owner") // back to issued, for the issue's whole TTL
	check("app:i", st+"I5400000", 90*time.Minute)
	st = at(16 * time.Second)
	s.Acquire(ctx, "i", "o", "", time.Second) // Acquire takes it too
	s.Complete(ctx, "i", "o", []byte("r"), time.Hour)
	check("app:i", st+"C\x00\x01or", time.Hour)
	s.Issue(ctx, "sub-i", time.Nanosecond) // rounded up
	check("app:sub-i", st+"I1", time.Millisecond)
	s.AcquireIssued(ctx, "never", "o", "", time.Minute) // writes nothing
	if keys := mr.Keys(); len(keys) != 4 {
		t.Fatalf("keys %q, want app:k, app:sub, app:i and app:sub-i only", keys)
	}

	// The default prefix.
	rueidisstore.New(c).Acquire(ctx, "k", "o", "", time.Minute)
	if !mr.Exists("idem:k") {
		t.Fatalf("keys %q, want idem:k among them", mr.Keys())
	}
}

// TestEveryKeyHasTTLOnRedis runs every operation on a real server and
// checks that each key under the prefix has a TTL.
func TestEveryKeyHasTTLOnRedis(t *testing.T) {
	c := client(t, redistest.Addr(t))
	ctx := t.Context()
	p := prefix("ttl")
	s := rueidisstore.New(c, rueidisstore.WithPrefix(p))
	for _, o := range everyOutcome[:len(everyOutcome)-1] { // but remove
		if err := o.run(ctx, s); err != nil {
			t.Fatalf("%s: %v", o.name, err)
		}
	}
	s.Acquire(ctx, "sub", "o", "", 100*time.Microsecond+time.Minute)
	s.Acquire(ctx, "held", "o", "", time.Minute)
	s.Extend(ctx, "held", "o", 100*time.Microsecond+time.Minute)
	keys, err := c.Do(ctx, c.B().Keys().Pattern(p+"*").Build()).AsStrSlice() // a test server: KEYS is fine
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 4 {
		t.Fatalf("keys %q, want k, i, sub and held", keys)
	}
	for _, k := range keys {
		if d := pttl(t, c, k); d <= 0 {
			t.Errorf("%s PTTL %v, want a TTL", k, d)
		}
	}
	if d := pttl(t, c, p+"k"); d < 59*time.Second {
		t.Errorf("done entry PTTL %v, want about a minute", d)
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
		"remove": func() error { _, err := s.Remove(ctx, "k"); return err },
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
	acquire := func(ctx context.Context, key string) (time.Duration, error) {
		start := time.Now()
		_, err := s.Acquire(ctx, key, "o", "", time.Minute)
		return time.Since(start), err
	}
	wantFail := func(what string, took time.Duration, err error, within time.Duration) {
		t.Helper()
		if err == nil || took > within || errors.Is(err, storage.ErrNotOwner) || errors.Is(err, storage.ErrInvalid) {
			t.Fatalf("acquire %s: %v after %v, want an error within %v", what, err, took, within)
		}
		t.Logf("acquire %s failed after %v: %v", what, took.Round(time.Millisecond), err)
	}
	if _, err := acquire(t.Context(), "before"); err != nil { // the policy's verdict, and connections
		t.Fatal(err)
	}

	srv.Pause()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	took, err := acquire(ctx, "stalled-deadline")
	cancel()
	wantFail("with a 100ms deadline on a stalled server", took, err, time.Second)
	took, err = acquire(t.Context(), "stalled")
	wantFail("without a deadline on a stalled server", took, err, 2*time.Second)
	srv.Resume()
	deadline := time.Now().Add(10 * time.Second)
	for { // the server answers what it buffered, then new connections
		_, err := acquire(t.Context(), "resumed")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("acquire after SIGCONT: %v", err)
		}
		time.Sleep(5 * time.Millisecond) // another process: nothing to wait on but time
	}

	srv.Kill()
	took, err = acquire(t.Context(), "killed")
	wantFail("on a killed server", took, err, time.Second)
}

// TestCorruptValue puts values that are not entries under a key: every
// operation fails with an error (not ErrNotOwner, not a panic) and leaves
// the value alone.
func TestCorruptValue(t *testing.T) {
	each(t, func(t *testing.T, c rueidis.Client, _ *miniredis.Miniredis) {
		ctx := t.Context()
		p := prefix("corrupt")
		s := rueidisstore.New(c, rueidisstore.WithPrefix(p))
		for _, v := range []string{
			"", "garbage", "D", "P", "P\x00", "P\x02fp", "X\x00abc", "D\x09short", "\x00\x00",
			"I", "I0", "I01", "I-5", "I5x", "I1.5", "I1234567890123456", "i5",
			"Q", "Q\x00", "Q\x00\x00o", "Q\x00\x015", "Q\x02fp\x025o", "Q\x00\x010o", "Q\x00\x02x1o",
			"C", "C\x00", "C\x02fp", "C\x00\x00", "C\x00\x00rec", "C\x00\x80\x00o", "C\x00\x05own",
			"C\x00\xff\xff\xff\xff\xff\x01o",
			"T", "T\x00", "T123456", "T\x00\x00\x00\x00\x00P\x00o", "T123456garbage", "T123456D\x00r",
			"T123456T123456P\x00o", "T123456P\x00", "T123456C\x00\x00", "T123456I", "T123456Q\x00\x00o",
		} {
			do(t, c, "SET", p+"bad", v, "PX", "60000")
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
				"lookup": func() error { _, err := s.Lookup(ctx, "bad", true); return err },
				"remove": func() error { _, err := s.Remove(ctx, "bad"); return err },
			} {
				err := f()
				if err == nil || errors.Is(err, storage.ErrNotOwner) || !strings.Contains(err.Error(), "not an idem entry") {
					t.Errorf("%s over %q: %v, want an error saying the value is not an entry", name, v, err)
				}
			}
			if got := get(t, c, p+"bad"); got != v {
				t.Errorf("value %q changed to %q", v, got)
			}
		}

		// A key of another type: Redis's own WRONGTYPE error.
		do(t, c, "DEL", p+"bad")
		do(t, c, "HSET", p+"bad", "f", "v")
		if _, err := s.Acquire(ctx, "bad", "o", "", time.Minute); err == nil || errors.Is(err, storage.ErrNotOwner) {
			t.Errorf("Acquire over a hash: %v, want an error", err)
		}
		if err := s.Release(ctx, "bad", "o"); err == nil || errors.Is(err, storage.ErrNotOwner) {
			t.Errorf("Release over a hash: %v, want an error", err)
		}
		if m := do(t, c, "TYPE", p+"bad"); func() string { v, _ := m.ToString(); return v }() != "hash" {
			t.Errorf("the hash is gone")
		}
	})
}

// TestScriptsAreSafeToRunTwice sends each script twice, as rueidis does
// when it resends a command after a network error, from two goroutines at
// once.
func TestScriptsAreSafeToRunTwice(t *testing.T) {
	each(t, func(t *testing.T, c rueidis.Client, _ *miniredis.Miniredis) {
		ctx := t.Context()
		s := rueidisstore.New(c, rueidisstore.WithPrefix(prefix("twice")))
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

// TestCompleteChecksTheOwnerOfADoneEntry: A's lease runs out while its
// handler runs, B acquires the key, runs and completes it with record R;
// A then completes with the very same R. That is a second execution, not
// a resend: A gets ErrNotOwner and the entry is left as B wrote it. B's
// resend of its Complete is still nil.
func TestCompleteChecksTheOwnerOfADoneEntry(t *testing.T) {
	each(t, func(t *testing.T, c rueidis.Client, mr *miniredis.Miniredis) {
		ctx := t.Context()
		p := prefix("owner")
		s := rueidisstore.New(c, rueidisstore.WithPrefix(p))
		if res, err := s.Acquire(ctx, "k", "A", "fp", 20*time.Millisecond); err != nil || res.State != storage.Acquired {
			t.Fatalf("A acquires: %+v, %v", res, err)
		}
		// A's lease runs out.
		if mr != nil {
			mr.FastForward(21 * time.Millisecond)
		} else {
			time.Sleep(25 * time.Millisecond) // Redis's clock: nothing to wait on but time
		}
		if res, err := s.Acquire(ctx, "k", "B", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatalf("B acquires after A's lease ran out: %+v, %v", res, err)
		}
		rec := []byte("R: the same response")
		if err := s.Complete(ctx, "k", "B", rec, time.Hour); err != nil {
			t.Fatalf("B completes: %v", err)
		}
		before := get(t, c, p+"k")
		if err := s.Complete(ctx, "k", "A", rec, 2*time.Hour); !errors.Is(err, storage.ErrNotOwner) {
			t.Errorf("A completes with B's very record: %v, want ErrNotOwner (A ran a second time)", err)
		}
		if err := s.Complete(ctx, "k", "B", []byte("R2"), 2*time.Hour); !errors.Is(err, storage.ErrNotOwner) {
			t.Errorf("B completes again with another record: %v, want ErrNotOwner", err)
		}
		if err := s.Complete(ctx, "k", "B", rec, 2*time.Hour); err != nil {
			t.Errorf("B's resend: %v, want nil", err)
		}
		if after := get(t, c, p+"k"); after != before {
			t.Errorf("entry changed from %q to %q", before, after)
		}
		if d := pttl(t, c, p+"k"); d > time.Hour {
			t.Errorf("PTTL %v after the refused completes: the TTL was renewed", d)
		}
		if res, err := s.Acquire(ctx, "k", "C", "fp", time.Minute); err != nil || res.State != storage.Done || string(res.Record) != string(rec) || res.Fingerprint != "fp" {
			t.Errorf("acquire after: %+v, %v; want done with B's record", res, err)
		}
	})
}

// TestOldDoneEntry: a done entry in the layout of a release before the
// owner was kept ('D', the fingerprint's length, the fingerprint, the
// record) is replayed; Complete cannot prove that its owner wrote it, so
// it answers ErrNotOwner even with the same record, and changes nothing.
func TestOldDoneEntry(t *testing.T) {
	each(t, func(t *testing.T, c rueidis.Client, _ *miniredis.Miniredis) {
		ctx := t.Context()
		p := prefix("old")
		s := rueidisstore.New(c, rueidisstore.WithPrefix(p))
		for _, tc := range []struct{ value, fp, rec string }{
			{"D\x02fprecord", "fp", "record"},
			{"D\x00", "", ""},
			{"D\x00\x00\x01C\x05", "", "\x00\x01C\x05"}, // a record that looks like a new entry's tail
		} {
			do(t, c, "SET", p+"k", tc.value, "PX", "3600000")
			res, err := s.Acquire(ctx, "k", "o", "x", time.Minute)
			if err != nil || res.State != storage.Done || res.Fingerprint != tc.fp || string(res.Record) != tc.rec {
				t.Errorf("acquire over %q: %+v, %v; want done, fingerprint %q, record %q", tc.value, res, err, tc.fp, tc.rec)
			}
			if err := s.Complete(ctx, "k", "o", []byte(tc.rec), time.Minute); !errors.Is(err, storage.ErrNotOwner) {
				t.Errorf("complete with the same record over %q: %v, want ErrNotOwner", tc.value, err)
			}
			if err := s.Release(ctx, "k", "o"); !errors.Is(err, storage.ErrNotOwner) {
				t.Errorf("release over %q: %v, want ErrNotOwner", tc.value, err)
			}
			if err := s.Issue(ctx, "k", time.Minute); !errors.Is(err, storage.ErrExists) {
				t.Errorf("issue over %q: %v, want ErrExists", tc.value, err)
			}
			if got := get(t, c, p+"k"); got != tc.value {
				t.Errorf("value %q changed to %q", tc.value, got)
			}
		}
	})
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

// TestNilReplyIsNotAnEntry: a nil reply must not pass for "no entry":
// every operation fails with an unexpected reply.
func TestNilReplyIsNotAnEntry(t *testing.T) {
	c := nilClient{client(t, miniredis.RunT(t).Addr())}
	s := rueidisstore.New(c, rueidisstore.WithEvictionAllowed())
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
