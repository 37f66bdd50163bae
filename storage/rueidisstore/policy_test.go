package rueidisstore_test

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
	"github.com/idemkit/idem/storage/rueidisstore"
	"github.com/redis/rueidis"
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
	run    func(ctx context.Context, s *rueidisstore.Store) error
}{
	{"acquire", true, func(ctx context.Context, s *rueidisstore.Store) error {
		_, err := s.Acquire(ctx, "k", "o", "fp", time.Minute)
		return err
	}},
	{"extend", false, func(ctx context.Context, s *rueidisstore.Store) error { return s.Extend(ctx, "k", "o", time.Minute) }},
	{"complete", false, func(ctx context.Context, s *rueidisstore.Store) error {
		return s.Complete(ctx, "k", "o", []byte("rec"), time.Minute)
	}},
	{"release", false, func(ctx context.Context, s *rueidisstore.Store) error { return s.Release(ctx, "k2", "o") }},
	{"issue", true, func(ctx context.Context, s *rueidisstore.Store) error { return s.Issue(ctx, "k3", time.Minute) }},
	{"acquire issued", true, func(ctx context.Context, s *rueidisstore.Store) error {
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
func wantRefused(t *testing.T, s *rueidisstore.Store, policy string) {
	t.Helper()
	for _, o := range storeOps {
		err := o.run(t.Context(), s)
		if !o.starts {
			if want := o.name == "release"; errors.Is(err, rueidisstore.ErrEvictionPolicy) || (err == nil) != want ||
				(!want && !errors.Is(err, storage.ErrNotOwner)) {
				t.Fatalf("%s with maxmemory-policy %s: %v, want it to reach the server (nil for release, ErrNotOwner otherwise)", o.name, policy, err)
			}
			continue
		}
		if !errors.Is(err, rueidisstore.ErrEvictionPolicy) {
			t.Fatalf("%s with maxmemory-policy %s: %v, want ErrEvictionPolicy", o.name, policy, err)
		}
		msg := err.Error()
		for _, want := range []string{"rueidisstore: " + o.name + ": ", "maxmemory-policy is " + policy, "noeviction", "rueidisstore.WithEvictionAllowed"} {
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
func wantWorks(t *testing.T, s *rueidisstore.Store) {
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

// dbSize returns the number of keys of the server behind c.
func dbSize(t *testing.T, c rueidis.Client) int64 {
	t.Helper()
	m := do(t, c, "DBSIZE")
	n, _ := m.ToInt64()
	return n
}

// setPolicy sets the maxmemory-policy of the server behind c.
func setPolicy(t *testing.T, c rueidis.Client, policy string) {
	t.Helper()
	do(t, c, "CONFIG", "SET", "maxmemory-policy", policy)
}

// TestEvictionPolicyRefused starts servers with evicting policies: every
// operation that starts new work fails with ErrEvictionPolicy, the very
// value redisstore's is, and writes nothing, unless the store opts out.
// With noeviction the store works.
func TestEvictionPolicyRefused(t *testing.T) {
	for _, policy := range []string{"allkeys-lru", "volatile-lru"} {
		t.Run(policy, func(t *testing.T) {
			c := client(t, redistest.Start(t, "--maxmemory-policy", policy))
			wantRefused(t, rueidisstore.New(c), policy)
			if n := dbSize(t, c); n != 0 {
				t.Fatalf("refused operations left %d keys", n)
			}
			wantWorks(t, rueidisstore.New(c, rueidisstore.WithEvictionAllowed()))
		})
	}
	t.Run("noeviction", func(t *testing.T) {
		wantWorks(t, rueidisstore.New(client(t, redistest.Start(t, "--maxmemory-policy", "noeviction"))))
	})
	t.Run("every evicting policy", func(t *testing.T) {
		c := client(t, redistest.Start(t))
		for _, policy := range evicting {
			setPolicy(t, c, policy)
			wantRefused(t, rueidisstore.New(c), policy)
		}
	})
}

// holdMax bounds how long infoHook holds an INFO.
const holdMax = 10 * time.Second

// infoHook counts the INFO commands sent through a hooked client and can
// hold them (gate) or fail them (fail) before they reach the server.
type infoHook struct {
	n       atomic.Int64
	entered chan struct{}             // one value per INFO that reached the hook, if not full
	gate    atomic.Pointer[chan bool] // non-nil: INFO waits until it is closed
	fail    atomic.Pointer[error]     // non-nil: INFO fails with it
	expired atomic.Bool               // an INFO was held for holdMax and let go
}

// newInfoHook returns a hook that lets every INFO through, and never
// leaves one held when the test ends.
func newInfoHook(t *testing.T) *infoHook {
	h := &infoHook{entered: make(chan struct{}, 64)}
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

// open lets the held INFO commands, and the next ones, through.
func (h *infoHook) open() {
	if c := h.gate.Swap(nil); c != nil {
		close(*c)
	}
}

// failWith makes INFO fail with err, or go through again for nil.
func (h *infoHook) failWith(err error) {
	if err == nil {
		h.fail.Store(nil)
		return
	}
	h.fail.Store(&err)
}

// hooked is a client whose INFO commands, to it or to one of its nodes,
// go through an infoHook. nodes, when set, stands in for the client's
// Nodes, and mode, when set, for its Mode.
type hooked struct {
	rueidis.Client
	h     *infoHook
	nodes func() map[string]rueidis.Client
	mode  rueidis.ClientMode
}

// Do sends cmd, through the hook when it is an INFO.
func (c hooked) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if args := cmd.Commands(); len(args) == 0 || args[0] != "INFO" {
		return c.Client.Do(ctx, cmd)
	}
	h := c.h
	h.n.Add(1)
	select {
	case h.entered <- struct{}{}:
	default:
	}
	if g := h.gate.Load(); g != nil {
		// Bounded, so that a store that wrongly waits for a held check
		// fails the test instead of hanging it.
		select {
		case <-*g:
		case <-time.After(holdMax):
			h.expired.Store(true)
		}
	}
	if err := h.fail.Load(); err != nil {
		return rueidis.NewErrorResult(*err)
	}
	return c.Client.Do(ctx, cmd)
}

// Nodes returns the nodes, each hooked too.
func (c hooked) Nodes() map[string]rueidis.Client {
	var nodes map[string]rueidis.Client
	if c.nodes != nil {
		nodes = c.nodes()
	} else {
		nodes = c.Client.Nodes()
	}
	out := make(map[string]rueidis.Client, len(nodes))
	for addr, n := range nodes {
		out[addr] = hooked{Client: n, h: c.h}
	}
	return out
}

// Mode returns mode, or the client's.
func (c hooked) Mode() rueidis.ClientMode {
	if c.mode != "" {
		return c.mode
	}
	return c.Client.Mode()
}

// newClocked returns a store on c whose verdicts age on a clock of the
// test's own.
func newClocked(c rueidis.Client, opts ...rueidisstore.Option) (*rueidisstore.Store, *testclock.Clock) {
	s := rueidisstore.New(c, opts...)
	clk := testclock.New(time.Now())
	rueidisstore.SetClock(s, clk.Now)
	return s, clk
}

// TestPolicyChangedAtRunTime changes the policy of a running server with
// CONFIG SET: a verdict stands for PolicyCheckEvery; the first operation
// after that is answered with the old verdict at once, without waiting
// for the check it starts in the background (held here until the test
// lets it go), and operations after the check see the new verdict. One
// INFO per check. (redisproto's tests cover the guard's other paths.)
func TestPolicyChangedAtRunTime(t *testing.T) {
	c := client(t, redistest.Start(t))
	h := newInfoHook(t)
	s, clk := newClocked(hooked{Client: c, h: h})
	ctx := t.Context()
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
	setPolicy(t, c, "allkeys-lru")
	clk.Advance(rueidisstore.PolicyCheckEvery - time.Millisecond)
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
	if err := acquire("d"); err != nil || h.expired.Load() {
		t.Fatalf("operation during the check: %v (waited for the check: %v), want the old verdict at once", err, h.expired.Load())
	}
	wantInfos(2) // one check in flight, not one per operation
	checked := rueidisstore.CheckRunning(s)
	if checked == nil {
		t.Fatal("no check in flight")
	}
	h.open()
	<-checked
	wantRefused(t, s, "allkeys-lru")

	setPolicy(t, c, "noeviction")
	clk.Advance(rueidisstore.PolicyCheckEvery)
	if err := acquire("e"); !errors.Is(err, rueidisstore.ErrEvictionPolicy) {
		t.Fatalf("first operation on a stale refusing verdict: %v, want the old verdict (refused)", err)
	}
	rueidisstore.WaitCheck(s)
	wantWorks(t, s)
	wantInfos(3)
}

// TestFirstUseWaitsForOneCheck starts many operations at once on a fresh
// store: they share one check and each gets its verdict.
func TestFirstUseWaitsForOneCheck(t *testing.T) {
	h := newInfoHook(t)
	s := rueidisstore.New(hooked{Client: client(t, redistest.Start(t, "--maxmemory-policy", "volatile-ttl")), h: h})
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range errs {
		wg.Go(func() { _, errs[i] = s.Acquire(t.Context(), "k"+strconv.Itoa(i), "o", "", time.Minute) })
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, rueidisstore.ErrEvictionPolicy) {
			t.Fatalf("operation %d: %v, want ErrEvictionPolicy", i, err)
		}
	}
	if n := h.n.Load(); n != 1 {
		t.Fatalf("%d INFO commands for 16 first operations, want 1", n)
	}
}

// TestPolicyCheckFails makes INFO fail as a network error would: no
// verdict, the operation goes on, and the next operation checks again; an
// older verdict stands while checks fail.
func TestPolicyCheckFails(t *testing.T) {
	h := newInfoHook(t)
	s, clk := newClocked(hooked{Client: client(t, redistest.Start(t, "--maxmemory-policy", "allkeys-lru")), h: h})
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
	clk.Advance(rueidisstore.PolicyCheckEvery)
	for range 3 {
		wantRefused(t, s, "allkeys-lru") // the last verdict stands
		rueidisstore.WaitCheck(s)
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
		h := newInfoHook(t)
		c := client(t, redistest.Start(t, "--maxmemory-policy", "allkeys-lru", "--rename-command", "INFO", ""))
		wantWorks(t, rueidisstore.New(hooked{Client: c, h: h}))
		if n := h.n.Load(); n != 1 {
			t.Fatalf("%d INFO commands, want 1", n)
		}
	})
	t.Run("NOPERM", func(t *testing.T) {
		addr := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
		do(t, client(t, addr), "ACL", "SETUSER", "idem", "on", ">pw", "~*", "+@all", "-info")
		opt := rueidisstore.ClientOption(addr)
		opt.Username, opt.Password = "idem", "pw"
		c, err := rueidis.NewClient(opt)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		if err := c.Do(t.Context(), c.B().Info().Section("memory").Build()).Error(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
			t.Fatalf("INFO as a user without +info: %v, want NOPERM", err)
		}
		h := newInfoHook(t)
		wantWorks(t, rueidisstore.New(hooked{Client: c, h: h}))
		if n := h.n.Load(); n != 1 {
			t.Fatalf("%d INFO commands, want 1", n)
		}
	})
	t.Run("miniredis", func(t *testing.T) {
		// miniredis answers INFO memory with an error reply; a transient
		// one (LOADING) gives no verdict, and the next operation asks
		// again.
		mr := miniredis.RunT(t)
		h := newInfoHook(t)
		s := rueidisstore.New(hooked{Client: client(t, mr.Addr()), h: h})
		mr.SetError("LOADING Redis is loading the dataset in memory")
		if _, err := s.Acquire(t.Context(), "k", "o", "", time.Minute); err == nil || errors.Is(err, rueidisstore.ErrEvictionPolicy) {
			t.Fatalf("acquire while loading: %v, want the server's error", err)
		}
		mr.SetError("")
		wantWorks(t, s)
		if n := h.n.Load(); n != 2 {
			t.Fatalf("%d INFO commands, want 2 (LOADING, then the answer)", n)
		}
	})
}

// fakeCluster returns a client that routes every command to the first of
// private servers started with the given policies, and that says it is a
// Cluster client whose nodes are all of them, so that each node can have
// a policy of its own without touching the cluster other tests share.
// INFO goes through h.
func fakeCluster(t *testing.T, h *infoHook, policies ...string) (rueidis.Client, []string) {
	nodes := map[string]rueidis.Client{}
	var addrs []string
	for _, p := range policies {
		addr := redistest.Start(t, "--maxmemory-policy", p)
		addrs = append(addrs, addr)
		nodes[addr] = client(t, addr)
	}
	return hooked{Client: nodes[addrs[0]], h: h, nodes: func() map[string]rueidis.Client { return nodes }, mode: rueidis.ClientModeCluster}, addrs
}

// TestEvictionPolicyCluster: the store asks every node of a Cluster
// client, and refuses when any one evicts, naming it.
func TestEvictionPolicyCluster(t *testing.T) {
	t.Run("one node evicts", func(t *testing.T) {
		h := newInfoHook(t)
		c, addrs := fakeCluster(t, h, "noeviction", "volatile-lfu", "noeviction")
		s := rueidisstore.New(c)
		wantRefused(t, s, "volatile-lfu")
		if n := h.n.Load(); n != 3 {
			t.Fatalf("%d INFO commands, want one per node", n)
		}
		_, err := s.Acquire(t.Context(), "k", "o", "", time.Minute)
		if want := "on node " + addrs[1] + ": "; err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("message %v does not say %q", err, want)
		}
		wantWorks(t, rueidisstore.New(c, rueidisstore.WithEvictionAllowed()))
	})
	t.Run("no node evicts", func(t *testing.T) {
		h := newInfoHook(t)
		c, _ := fakeCluster(t, h, "noeviction", "noeviction", "noeviction")
		wantWorks(t, rueidisstore.New(c))
		if n := h.n.Load(); n != 3 {
			t.Fatalf("%d INFO commands, want one per node", n)
		}
	})
	t.Run("no node known", func(t *testing.T) {
		// A client that knows no node (yet) gives no verdict: operations
		// go on, and each checks again, until the node is known.
		h := newInfoHook(t)
		addr := redistest.Start(t, "--maxmemory-policy", "allkeys-random")
		c := client(t, addr)
		var known atomic.Bool
		nodes := func() map[string]rueidis.Client {
			if !known.Load() {
				return nil
			}
			return map[string]rueidis.Client{addr: c}
		}
		s := rueidisstore.New(hooked{Client: c, h: h, nodes: nodes, mode: rueidis.ClientModeCluster})
		for i := range 2 {
			if _, err := s.Acquire(t.Context(), "n"+strconv.Itoa(i), "o", "", time.Minute); err != nil {
				t.Fatalf("acquire %d with no node known: %v, want it to go on", i, err)
			}
		}
		known.Store(true)
		wantRefused(t, s, "allkeys-random")
	})
}

// TestEvictionPolicySharedCluster runs on the cluster the package's tests
// share, read-only: every node is asked (three masters, no replicas),
// they have noeviction, and a store on it works.
func TestEvictionPolicySharedCluster(t *testing.T) {
	h := newInfoHook(t)
	c := client(t, redistest.ClusterAddrs(t)...)
	wantWorks(t, rueidisstore.New(hooked{Client: c, h: h}, rueidisstore.WithPrefix(prefix("policy"))))
	if n, nodes := h.n.Load(), len(c.Nodes()); n != int64(nodes) || nodes != redistest.ClusterMasters {
		t.Fatalf("%d INFO commands to a cluster of %d nodes, want one each, for %d", n, nodes, redistest.ClusterMasters)
	}
}

// TestFinishingWorkWhileEvicting flips a running server to an evicting
// policy while entries are held: the check refuses what starts new work
// (Acquire, AcquireIssued, Issue), but an execution that already ran must
// still be able to keep its lease, store its record and release: refused,
// its record would be lost and the retry would run it again. The record
// stored while the policy is bad is replayed once the policy is back.
func TestFinishingWorkWhileEvicting(t *testing.T) {
	c := client(t, redistest.Start(t))
	s, clk := newClocked(c, rueidisstore.WithPrefix("p:"))
	ctx := t.Context()
	// newVerdict makes the store check the policy again and take the
	// check's verdict: the first Acquire on a stale verdict starts the
	// check (before it returns) and answers with the old verdict; the
	// check may have ended before WaitCheck looks.
	newVerdict := func() {
		t.Helper()
		clk.Advance(rueidisstore.PolicyCheckEvery)
		s.Acquire(ctx, "trigger", "o", "", time.Minute)
		rueidisstore.WaitCheck(s)
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

	setPolicy(t, c, "allkeys-lru")
	newVerdict()
	if _, err := s.Acquire(ctx, "new", "o", "fp", time.Minute); !errors.Is(err, rueidisstore.ErrEvictionPolicy) {
		t.Fatalf("acquire of a new key after the flip: %v, want ErrEvictionPolicy", err)
	}
	if err := s.Extend(ctx, "done", "o-done", 2*time.Minute); err != nil {
		t.Errorf("extend of a lease taken before the flip: %v, want nil", err)
	}
	if err := s.Complete(ctx, "done", "o-done", []byte("rec"), time.Hour); err != nil {
		t.Errorf("complete of a lease taken before the flip: %v, want nil", err)
	}
	if err := s.Release(ctx, "released", "o-released"); err != nil {
		t.Errorf("release of a lease taken before the flip: %v, want nil", err)
	}
	if err := s.Release(ctx, "issued", "o-issued"); err != nil {
		t.Errorf("release of an issued key taken before the flip: %v, want nil", err)
	}
	// Replay is an Acquire, refused while the policy is bad: the record
	// is there all the same.
	if _, err := s.Acquire(ctx, "done", "retry", "fp", time.Minute); !errors.Is(err, rueidisstore.ErrEvictionPolicy) {
		t.Errorf("acquire (replay) while evicting: %v, want ErrEvictionPolicy", err)
	}
	if v := get(t, c, "p:done"); !strings.HasSuffix(v, "rec") {
		t.Errorf("done entry %q, want the record stored", v)
	}

	setPolicy(t, c, "noeviction")
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
