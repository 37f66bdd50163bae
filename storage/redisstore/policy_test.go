package redisstore_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/internal/testclock"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// evicting lists the policies that may evict the store's keys: all but
// noeviction (Redis 7).
var evicting = []string{
	"allkeys-lru", "allkeys-lfu", "allkeys-random",
	"volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl",
}

// storeOps are the six operations, on a key held by owner "o" when the
// store works (the last two on a key they issue and take). starts marks
// those that start new work, the only ones the policy check refuses.
var storeOps = []struct {
	name   string
	starts bool
	run    func(ctx context.Context, s *redisstore.Store) error
}{
	{"acquire", true, func(ctx context.Context, s *redisstore.Store) error {
		_, err := s.Acquire(ctx, "k", "o", "fp", time.Minute)
		return err
	}},
	{"extend", false, func(ctx context.Context, s *redisstore.Store) error { return s.Extend(ctx, "k", "o", time.Minute) }},
	{"complete", false, func(ctx context.Context, s *redisstore.Store) error {
		return s.Complete(ctx, "k", "o", []byte("rec"), time.Minute)
	}},
	{"release", false, func(ctx context.Context, s *redisstore.Store) error { return s.Release(ctx, "k2", "o") }},
	{"issue", true, func(ctx context.Context, s *redisstore.Store) error { return s.Issue(ctx, "k3", time.Minute) }},
	{"acquire issued", true, func(ctx context.Context, s *redisstore.Store) error {
		res, err := s.AcquireIssued(ctx, "k3", "o", "fp", time.Minute)
		if err == nil && res.State != storage.Acquired {
			return errors.New("state " + res.State.String() + ", want acquired")
		}
		return err
	}},
}

// wantRefused checks that every operation that starts new work fails with
// ErrEvictionPolicy and a message that names the operation, the policy
// and the ways out, and that the others (extend, complete, release, here
// of keys nobody holds) are not refused: they reach the server, which
// answers ErrNotOwner for extend and complete, nil for release.
func wantRefused(t *testing.T, s *redisstore.Store, policy string) {
	t.Helper()
	for _, o := range storeOps {
		err := o.run(t.Context(), s)
		if !o.starts {
			if want := o.name == "release"; errors.Is(err, redisstore.ErrEvictionPolicy) || (err == nil) != want ||
				(!want && !errors.Is(err, storage.ErrNotOwner)) {
				t.Fatalf("%s with maxmemory-policy %s: %v, want it to reach the server (nil for release, ErrNotOwner otherwise)", o.name, policy, err)
			}
			continue
		}
		if !errors.Is(err, redisstore.ErrEvictionPolicy) {
			t.Fatalf("%s with maxmemory-policy %s: %v, want ErrEvictionPolicy", o.name, policy, err)
		}
		msg := err.Error()
		for _, want := range []string{"redisstore: " + o.name + ": ", "maxmemory-policy is " + policy, "noeviction", "WithEvictionAllowed"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: message %q does not say %q", o.name, msg, want)
			}
		}
		if errors.Is(err, storage.ErrNotOwner) || errors.Is(err, storage.ErrInvalid) {
			t.Errorf("%s: %v is a storage error too", o.name, err)
		}
	}
}

// wantWorks runs every operation through a whole entry's life.
func wantWorks(t *testing.T, s *redisstore.Store) {
	t.Helper()
	ctx := t.Context()
	if _, err := s.Acquire(ctx, "k2", "o", "fp", time.Minute); err != nil {
		t.Fatalf("acquire k2: %v", err)
	}
	for _, o := range storeOps {
		if err := o.run(ctx, s); err != nil {
			t.Fatalf("%s: %v", o.name, err)
		}
	}
	if res, err := s.Acquire(ctx, "k", "o2", "fp", time.Minute); err != nil || res.State != storage.Done {
		t.Fatalf("acquire after complete: %+v, %v; want done", res, err)
	}
}

// TestEvictionPolicyRefused starts servers with evicting policies: every
// operation fails with ErrEvictionPolicy and writes nothing, unless the
// store opts out. With noeviction the store works.
func TestEvictionPolicyRefused(t *testing.T) {
	for _, policy := range []string{"allkeys-lru", "volatile-lru"} {
		t.Run(policy, func(t *testing.T) {
			rdb := client(t, redistest.Start(t, "--maxmemory-policy", policy))
			wantRefused(t, redisstore.New(rdb), policy)
			if n := rdb.DBSize(t.Context()).Val(); n != 0 {
				t.Fatalf("refused operations left %d keys", n)
			}
			wantWorks(t, redisstore.New(rdb, redisstore.WithEvictionAllowed()))
		})
	}
	t.Run("noeviction", func(t *testing.T) {
		wantWorks(t, redisstore.New(client(t, redistest.Start(t, "--maxmemory-policy", "noeviction"))))
	})
	t.Run("every evicting policy", func(t *testing.T) {
		rdb := client(t, redistest.Start(t))
		for _, policy := range evicting {
			if err := rdb.ConfigSet(t.Context(), "maxmemory-policy", policy).Err(); err != nil {
				t.Fatal(err)
			}
			wantRefused(t, redisstore.New(rdb), policy)
		}
	})
}

// TestEvictionDangerCaught shows what the check prevents: on a full Redis
// with allkeys-lru, other data evicts an in-flight entry and a duplicate
// acquires the key again, which would run the handler twice. A store
// without the opt-out refuses that server from its first operation.
func TestEvictionDangerCaught(t *testing.T) {
	rdb := client(t, redistest.Start(t, "--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru"))
	ctx := t.Context()
	unsafe := redisstore.New(rdb, redisstore.WithEvictionAllowed(), redisstore.WithPrefix("idem:"))
	if res, err := unsafe.Acquire(ctx, "k", "first", "fp", time.Hour); err != nil || res.State != storage.Acquired {
		t.Fatalf("first acquire: %+v, %v", res, err)
	}
	// Another application fills the server: 16 KiB values, 1.6 MB a
	// batch, at most 100 batches (a few of them evict the entry).
	value := strings.Repeat("x", 16<<10)
	evicted, batches := false, 0
	for ; batches < 100 && !evicted; batches++ {
		batch := batches
		if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range 100 {
				p.Set(ctx, "other:"+strconv.Itoa(batch)+":"+strconv.Itoa(i), value, 0)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		// EXISTS does not touch the key's LRU clock.
		n, err := rdb.Exists(ctx, "idem:k").Result()
		if err != nil {
			t.Fatal(err)
		}
		evicted = n == 0
	}
	if !evicted {
		t.Skip("the in-flight entry survived 160 MB of other data; the danger is not shown, the check is tested elsewhere")
	}
	if res, err := unsafe.Acquire(ctx, "k", "duplicate", "fp", time.Hour); err != nil || res.State != storage.Acquired {
		t.Fatalf("duplicate acquire after eviction: %+v, %v; the danger is that it acquires", res, err)
	}
	t.Logf("an in-flight entry was evicted after %d batches of other data, and a duplicate acquired its key", batches)

	guarded := redisstore.New(rdb, redisstore.WithPrefix("idem:"))
	if _, err := guarded.Acquire(ctx, "k2", "first", "fp", time.Hour); !errors.Is(err, redisstore.ErrEvictionPolicy) {
		t.Fatalf("acquire on a store without the opt-out: %v, want ErrEvictionPolicy", err)
	}
}

// holdMax bounds how long infoHook holds an INFO.
const holdMax = 10 * time.Second

// infoHook counts the INFO commands a client sends and can hold them
// (gate) or fail them (fail) before they reach the server.
type infoHook struct {
	n       atomic.Int64
	entered chan struct{}             // one value per INFO that reached the hook, if not full
	gate    atomic.Pointer[chan bool] // non-nil: INFO waits until it is closed
	fail    atomic.Pointer[error]     // non-nil: INFO fails with it
	expired atomic.Bool               // an INFO was held for holdMax and let go
}

func newInfoHook(t *testing.T, rdb interface{ AddHook(redis.Hook) }) *infoHook {
	h := &infoHook{entered: make(chan struct{}, 64)}
	rdb.AddHook(h)
	t.Cleanup(h.open) // never leave a check blocked
	return h
}

// hold makes INFO wait until open is called. It empties entered first:
// a test that then waits on entered waits for a held INFO, not for one
// that went through before (rueidisstore's TestPolicyChangedAtRunTime
// read the first check's value and counted 1 INFO, not 2, on a loaded
// machine).
func (h *infoHook) hold() {
	for len(h.entered) > 0 {
		<-h.entered
	}
	c := make(chan bool)
	h.gate.Store(&c)
}

func (h *infoHook) open() {
	if c := h.gate.Swap(nil); c != nil {
		close(*c)
	}
}

func (h *infoHook) failWith(err error) {
	if err == nil {
		h.fail.Store(nil)
		return
	}
	h.fail.Store(&err)
}

func (h *infoHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *infoHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *infoHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "info" {
			return next(ctx, cmd)
		}
		h.n.Add(1)
		select {
		case h.entered <- struct{}{}:
		default:
		}
		if c := h.gate.Load(); c != nil {
			// Bounded, so that a store that wrongly waits for a held check
			// fails the test instead of hanging it.
			select {
			case <-*c:
			case <-time.After(holdMax):
				h.expired.Store(true)
			}
		}
		if err := h.fail.Load(); err != nil {
			cmd.SetErr(*err)
			return *err
		}
		return next(ctx, cmd)
	}
}

// newClocked returns a store on rdb whose verdicts age on a clock of the
// test's own.
func newClocked(rdb redis.UniversalClient, opts ...redisstore.Option) (*redisstore.Store, *testclock.Clock) {
	s := redisstore.New(rdb, opts...)
	clk := testclock.New(time.Now())
	redisstore.SetClock(s, clk.Now)
	return s, clk
}

// TestPolicyChangedAtRunTime changes the policy of a running server with
// CONFIG SET: a verdict stands for PolicyCheckEvery; the first operation
// after that is answered with the old verdict at once, without waiting
// for the check it starts in the background (held here until the test
// lets it go), and operations after the check see the new verdict. One
// INFO per check, however many operations.
func TestPolicyChangedAtRunTime(t *testing.T) {
	rdb := client(t, redistest.Start(t))
	h := newInfoHook(t, rdb)
	s, clk := newClocked(rdb)
	ctx := t.Context()
	setPolicy := func(p string) {
		t.Helper()
		if err := rdb.ConfigSet(ctx, "maxmemory-policy", p).Err(); err != nil {
			t.Fatal(err)
		}
	}
	acquire := func(key string) error {
		_, err := s.Acquire(ctx, key, "o", "fp", time.Minute)
		return err
	}
	wantInfos := func(want int64) {
		t.Helper()
		if n := h.n.Load(); n != want {
			t.Fatalf("%d INFO commands, want %d", n, want)
		}
	}

	if err := acquire("a"); err != nil {
		t.Fatal(err)
	}
	wantInfos(1)
	setPolicy("allkeys-lru")
	clk.Advance(redisstore.PolicyCheckEvery - time.Millisecond)
	if err := acquire("b"); err != nil {
		t.Fatalf("verdict still fresh: %v", err)
	}
	wantInfos(1)

	clk.Advance(time.Millisecond) // stale
	h.hold()
	if err := acquire("c"); err != nil || h.expired.Load() { // the old verdict, while INFO is held
		t.Fatalf("first operation on a stale verdict: %v (waited for the check: %v), want the old verdict (works) at once", err, h.expired.Load())
	}
	<-h.entered // the check it started is at the server's door
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range errs {
		wg.Go(func() { errs[i] = acquire("d" + strconv.Itoa(i)) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil || h.expired.Load() {
			t.Fatalf("operation %d during the check: %v (waited for the check: %v), want the old verdict at once", i, err, h.expired.Load())
		}
	}
	wantInfos(2) // one check in flight, not one per operation
	// Taken while the check is held at the server's door: once it is
	// let through it may end before anything could look for it (seen
	// under load with WaitCheck after open: "no check in flight").
	checked := redisstore.CheckRunning(s)
	if checked == nil {
		t.Fatal("no check in flight")
	}
	h.open()
	<-checked
	wantRefused(t, s, "allkeys-lru")

	setPolicy("noeviction")
	clk.Advance(redisstore.PolicyCheckEvery)
	if err := acquire("e"); !errors.Is(err, redisstore.ErrEvictionPolicy) {
		t.Fatalf("first operation on a stale refusing verdict: %v, want the old verdict (refused)", err)
	}
	redisstore.WaitCheck(s)
	wantWorks(t, s)
	wantInfos(3)
}

// TestFirstUseWaitsForOneCheck starts many operations at once on a fresh
// store: they share one check and each gets its verdict.
func TestFirstUseWaitsForOneCheck(t *testing.T) {
	rdb := client(t, redistest.Start(t, "--maxmemory-policy", "volatile-ttl"))
	h := newInfoHook(t, rdb)
	s := redisstore.New(rdb)
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range errs {
		wg.Go(func() { _, errs[i] = s.Acquire(t.Context(), "k"+strconv.Itoa(i), "o", "", time.Minute) })
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, redisstore.ErrEvictionPolicy) {
			t.Fatalf("operation %d: %v, want ErrEvictionPolicy", i, err)
		}
	}
	if n := h.n.Load(); n != 1 {
		t.Fatalf("%d INFO commands for 16 first operations, want 1", n)
	}
}

// TestFirstUseGivesUpWithItsContext holds the first check: the operation
// waiting for it returns its context's error when the context ends; the
// check goes on and gives its verdict to the next operation.
func TestFirstUseGivesUpWithItsContext(t *testing.T) {
	rdb := client(t, redistest.Start(t, "--maxmemory-policy", "allkeys-lru"))
	h := newInfoHook(t, rdb)
	s := redisstore.New(rdb)
	h.hold()
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		select {
		case <-h.entered:
		case <-t.Context().Done():
		}
		cancel()
	}()
	if _, err := s.Acquire(ctx, "k", "o", "", time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire canceled while waiting for the first check: %v, want context.Canceled", err)
	}
	h.open()
	redisstore.WaitCheck(s)
	wantRefused(t, s, "allkeys-lru")
	if n := h.n.Load(); n != 1 {
		t.Fatalf("%d INFO commands, want 1", n)
	}
}

// TestPolicyCheckFails makes INFO fail as a network error would: no
// verdict, the operation goes on, and the next operation checks again; an
// older verdict stands while checks fail.
func TestPolicyCheckFails(t *testing.T) {
	rdb := client(t, redistest.Start(t, "--maxmemory-policy", "allkeys-lru"))
	h := newInfoHook(t, rdb)
	s, clk := newClocked(rdb)
	ctx := t.Context()
	h.failWith(&net.OpError{Op: "read", Net: "tcp", Err: errors.New("injected")})
	for i := range 3 {
		// Allowed through, on a server that evicts: the documented cost of
		// a check that could not be made.
		if _, err := s.Acquire(ctx, "k"+strconv.Itoa(i), "o", "", time.Minute); err != nil {
			t.Fatalf("acquire %d while INFO fails: %v, want it to go on", i, err)
		}
		if n := h.n.Load(); n != int64(i+1) {
			t.Fatalf("acquire %d: %d INFO commands, want one per operation until a verdict", i, n)
		}
	}
	h.failWith(nil)
	wantRefused(t, s, "allkeys-lru")
	if n := h.n.Load(); n != 4 {
		t.Fatalf("%d INFO commands, want 4", n)
	}

	h.failWith(context.DeadlineExceeded)
	clk.Advance(redisstore.PolicyCheckEvery)
	for range 3 {
		wantRefused(t, s, "allkeys-lru") // the last verdict stands
		redisstore.WaitCheck(s)
	}
	if n := h.n.Load(); n < 5 {
		t.Fatalf("%d INFO commands, want a check again after the verdict aged", n)
	}
}

// TestServerThatDoesNotTell covers the servers whose policy cannot be
// read: they are not refused (here on a server that does evict, to show
// the decision), and asked once per PolicyCheckEvery, not per operation.
func TestServerThatDoesNotTell(t *testing.T) {
	t.Run("INFO renamed away", func(t *testing.T) {
		rdb := client(t, redistest.Start(t, "--maxmemory-policy", "allkeys-lru", "--rename-command", "INFO", ""))
		h := newInfoHook(t, rdb)
		wantWorks(t, redisstore.New(rdb))
		if n := h.n.Load(); n != 1 {
			t.Fatalf("%d INFO commands, want 1", n)
		}
	})
	t.Run("NOPERM", func(t *testing.T) {
		addr := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
		if err := client(t, addr).Do(t.Context(), "ACL", "SETUSER", "idem", "on", ">pw", "~*", "+@all", "-info").Err(); err != nil {
			t.Fatal(err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: addr, Username: "idem", Password: "pw", MaxRetries: -1})
		t.Cleanup(func() { rdb.Close() })
		if err := rdb.Info(t.Context(), "memory").Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
			t.Fatalf("INFO as a user without +info: %v, want NOPERM", err)
		}
		h := newInfoHook(t, rdb)
		wantWorks(t, redisstore.New(rdb))
		if n := h.n.Load(); n != 1 {
			t.Fatalf("%d INFO commands, want 1", n)
		}
	})
	t.Run("miniredis", func(t *testing.T) {
		// miniredis answers INFO memory with an error reply; a transient
		// one (LOADING) gives no verdict, and the next operation asks
		// again.
		mr := miniredis.RunT(t)
		rdb := client(t, mr.Addr())
		h := newInfoHook(t, rdb)
		s := redisstore.New(rdb)
		mr.SetError("LOADING Redis is loading the dataset in memory")
		if _, err := s.Acquire(t.Context(), "k", "o", "", time.Minute); err == nil || errors.Is(err, redisstore.ErrEvictionPolicy) {
			t.Fatalf("acquire while loading: %v, want the server's error", err)
		}
		mr.SetError("")
		wantWorks(t, s)
		if n := h.n.Load(); n != 2 {
			t.Fatalf("%d INFO commands, want 2 (LOADING, then the answer)", n)
		}
	})
}

// TestEvictionPolicyCluster builds a redis.ClusterClient over private
// standalone servers (ClusterOptions.ClusterSlots), one master per third
// of the slots, so that each master can have a policy of its own without
// touching the cluster other tests share: the store asks every master
// (ForEachMaster) and refuses when any one evicts, naming it.
func TestEvictionPolicyCluster(t *testing.T) {
	cluster := func(t *testing.T, policies ...string) (*redis.ClusterClient, []string) {
		var addrs []string
		var slots []redis.ClusterSlot
		for i, p := range policies {
			addr := redistest.Start(t, "--maxmemory-policy", p)
			addrs = append(addrs, addr)
			slots = append(slots, redis.ClusterSlot{
				Start: i * 16384 / len(policies), End: (i+1)*16384/len(policies) - 1,
				Nodes: []redis.ClusterNode{{Addr: addr}},
			})
		}
		rdb := redis.NewClusterClient(&redis.ClusterOptions{
			ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) { return slots, nil },
			MaxRetries:   -1,
		})
		t.Cleanup(func() { rdb.Close() })
		return rdb, addrs
	}
	t.Run("one master evicts", func(t *testing.T) {
		rdb, addrs := cluster(t, "noeviction", "volatile-lfu", "noeviction")
		s := redisstore.New(rdb)
		wantRefused(t, s, "volatile-lfu")
		_, err := s.Acquire(t.Context(), "k", "o", "", time.Minute)
		// go-redis drops a loopback host from the addresses ClusterSlots
		// gives, so the node reads ":port" here.
		_, port, _ := net.SplitHostPort(addrs[1])
		if want := ":" + port + ": "; err == nil || !strings.Contains(err.Error(), "on master ") || !strings.Contains(err.Error(), want) {
			t.Fatalf("message %v does not name the master on port %s", err, port)
		}
		wantWorks(t, redisstore.New(rdb, redisstore.WithEvictionAllowed()))
	})
	t.Run("no master evicts", func(t *testing.T) {
		rdb, _ := cluster(t, "noeviction", "noeviction", "noeviction")
		s := redisstore.New(rdb)
		wantWorks(t, s)
		// Keys on every master.
		for i := range 32 {
			if _, err := s.Acquire(t.Context(), "spread"+strconv.Itoa(i), "o", "", time.Minute); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestEvictionPolicyRing asks every shard of a redis.Ring.
func TestEvictionPolicyRing(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t, "--maxmemory-policy", "allkeys-lfu")
	rdb := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a, "b": b}, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	wantRefused(t, redisstore.New(rdb), "allkeys-lfu")
	_, err := redisstore.New(rdb).Acquire(t.Context(), "k", "o", "", time.Minute)
	if want := "on shard " + b; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("message %v does not say %q", err, want)
	}
}

// TestEvictionPolicySharedCluster runs on the cluster the package's tests
// share, read-only: its masters have noeviction, and a store on it works.
func TestEvictionPolicySharedCluster(t *testing.T) {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	wantWorks(t, redisstore.New(rdb, redisstore.WithPrefix(prefix("policy"))))
}

// TestEvictionPolicyClusterUnknown: a cluster whose layout cannot be
// loaded, or that lists no master, gives no verdict; the next operation
// checks again.
func TestEvictionPolicyClusterUnknown(t *testing.T) {
	addr := redistest.Start(t, "--maxmemory-policy", "allkeys-random")
	var layout atomic.Int64 // 0: an error, 1: no master, 2: the server above
	rdb := redis.NewClusterClient(&redis.ClusterOptions{
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			switch layout.Load() {
			case 0:
				return nil, errors.New("injected: no layout")
			case 1:
				return nil, nil
			}
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: addr}}}}, nil
		},
		MaxRetries: -1,
	})
	t.Cleanup(func() { rdb.Close() })
	s := redisstore.New(rdb)
	for want := range 2 {
		layout.Store(int64(want))
		if _, err := s.Acquire(t.Context(), "k", "o", "", time.Minute); err == nil || errors.Is(err, redisstore.ErrEvictionPolicy) {
			t.Fatalf("layout %d: %v, want the cluster's own error", want, err)
		}
	}
	layout.Store(2)
	wantRefused(t, s, "allkeys-random")
}

// TestFinishingWorkWhileEvicting flips a running server to an evicting
// policy while entries are held: the check refuses what starts new work
// (Acquire, AcquireIssued, Issue), but an execution that already ran must
// still be able to keep its lease, store its record and release: refused,
// its record would be lost and the retry would run it again. The record
// stored while the policy is bad is replayed once the policy is back.
func TestFinishingWorkWhileEvicting(t *testing.T) {
	rdb := client(t, redistest.Start(t))
	s, clk := newClocked(rdb, redisstore.WithPrefix("p:"))
	ctx := t.Context()
	setPolicy := func(p string) {
		t.Helper()
		if err := rdb.ConfigSet(ctx, "maxmemory-policy", p).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// newVerdict makes the store check the policy again and take the
	// check's verdict: the first Acquire on a stale verdict starts the
	// check (before it returns) and answers with the old verdict; the
	// check may have ended before WaitCheck looks.
	newVerdict := func() {
		t.Helper()
		clk.Advance(redisstore.PolicyCheckEvery)
		s.Acquire(ctx, "trigger", "o", "", time.Minute)
		redisstore.WaitCheck(s)
	}
	for _, k := range []string{"done", "released"} {
		if res, err := s.Acquire(ctx, k, "o-"+k, "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatalf("acquire %s before the flip: %+v, %v", k, res, err)
		}
	}
	if err := s.Issue(ctx, "issued", time.Hour); err != nil {
		t.Fatal(err)
	}
	if res, err := s.AcquireIssued(ctx, "issued", "o-issued", "fp", time.Minute); err != nil || res.State != storage.Acquired {
		t.Fatalf("acquire issued before the flip: %+v, %v", res, err)
	}

	setPolicy("allkeys-lru")
	newVerdict()
	if _, err := s.Acquire(ctx, "new", "o", "fp", time.Minute); !errors.Is(err, redisstore.ErrEvictionPolicy) {
		t.Fatalf("acquire of a new key after the flip: %v, want ErrEvictionPolicy", err)
	}
	if err := s.Extend(ctx, "done", "o-done", 2*time.Minute); err != nil {
		t.Errorf("extend of a lease taken before the flip: %v, want nil", err)
	}
	if d := rdb.PTTL(ctx, "p:done").Val(); d <= time.Minute {
		t.Errorf("lease PTTL %v after extend to 2m", d)
	}
	if err := s.Complete(ctx, "done", "o-done", []byte("rec"), time.Hour); err != nil {
		t.Errorf("complete of a lease taken before the flip: %v, want nil", err)
	}
	if err := s.Complete(ctx, "done", "o-done", []byte("rec"), time.Hour); err != nil {
		t.Errorf("complete resent: %v, want nil", err)
	}
	if err := s.Complete(ctx, "done", "another", []byte("rec"), time.Hour); !errors.Is(err, storage.ErrNotOwner) {
		t.Errorf("complete by another owner: %v, want ErrNotOwner (owner-checked as always)", err)
	}
	if err := s.Release(ctx, "released", "o-released"); err != nil {
		t.Errorf("release of a lease taken before the flip: %v, want nil", err)
	}
	if err := s.Release(ctx, "issued", "o-issued"); err != nil {
		t.Errorf("release of an issued key taken before the flip: %v, want nil", err)
	}
	// Replay is an Acquire, refused while the policy is bad: the record
	// is there all the same.
	if _, err := s.Acquire(ctx, "done", "retry", "fp", time.Minute); !errors.Is(err, redisstore.ErrEvictionPolicy) {
		t.Errorf("acquire (replay) while evicting: %v, want ErrEvictionPolicy", err)
	}
	if v, err := rdb.Get(ctx, "p:done").Result(); err != nil || !strings.HasSuffix(v, "rec") {
		t.Errorf("done entry %q (%v), want the record stored", v, err)
	}
	if n := rdb.Exists(ctx, "p:released").Val(); n != 0 {
		t.Errorf("released entry still there")
	}
	if v := rdb.Get(ctx, "p:issued").Val(); !strings.HasPrefix(v, "T") || !strings.HasSuffix(v, "I3600000") {
		t.Errorf("issued key released to %q, want issued again", v)
	}

	setPolicy("noeviction")
	newVerdict()
	if res, err := s.Acquire(ctx, "done", "retry", "fp", time.Minute); err != nil || res.State != storage.Done || string(res.Record) != "rec" {
		t.Errorf("retry after the policy is back: %+v, %v; want the record replayed", res, err)
	}
	if res, err := s.Acquire(ctx, "released", "retry", "fp", time.Minute); err != nil || res.State != storage.Acquired {
		t.Errorf("retry of the released key: %+v, %v; want acquired", res, err)
	}
	if res, err := s.AcquireIssued(ctx, "issued", "retry", "fp", time.Minute); err != nil || res.State != storage.Acquired {
		t.Errorf("retry of the released issued key: %+v, %v; want acquired", res, err)
	}
}
