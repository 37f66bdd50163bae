package redisinterop_test

import (
	"crypto/rand"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/idemkit/idem/storage/rueidisstore"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// TestMain stops the redis-servers the tests started and fails the run if
// a goroutine leaked.
func TestMain(m *testing.M) { leakcheck.Main(redistest.Wrap(m)) }

// store is what both stores are.
type store interface {
	storage.Issuer
	storage.Inspector
}

// named is a store and the client it runs on.
type named struct {
	name string
	store
}

// pair returns a redisstore and a rueidisstore on the same Redis (the
// one server at addrs, or the nodes of a cluster) under one prefix of the
// test's own.
func pair(t *testing.T, cluster bool, addrs ...string) (goredis, rueidisS named) {
	t.Helper()
	prefix := "interop:" + rand.Text()[:8] + ":"
	var rdb redis.UniversalClient
	if cluster {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	} else {
		rdb = redis.NewClient(redisstore.ClientOptions(addrs[0]))
	}
	t.Cleanup(func() { rdb.Close() })
	// rueidisstore's options, but a connection given up after seconds of
	// silence, not 250 ms: a loaded machine may keep one silent that long.
	opt := rueidisstore.ClientOption(addrs...)
	opt.Dialer.KeepAlive, opt.ConnWriteTimeout = time.Second, 10*time.Second
	opt.Dialer.Timeout = 10 * time.Second // rueidis bounds a new connection's handshake (HELLO) by it too
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return named{"redisstore", redisstore.New(rdb, redisstore.WithPrefix(prefix))},
		named{"rueidisstore", rueidisstore.New(c, rueidisstore.WithPrefix(prefix))}
}

// each runs f on a real server and on the real cluster, in both
// directions: a writes, b reads and finishes.
func each(t *testing.T, f func(t *testing.T, a, b named)) {
	for _, backend := range []struct {
		name    string
		cluster bool
		addrs   func(t testing.TB) []string
	}{
		{"redis", false, func(t testing.TB) []string { return []string{redistest.Addr(t)} }},
		{"cluster", true, redistest.ClusterAddrs},
	} {
		t.Run(backend.name, func(t *testing.T) {
			g, r := pair(t, backend.cluster, backend.addrs(t)...)
			t.Run("redisstore then rueidisstore", func(t *testing.T) { f(t, g, r) })
			t.Run("rueidisstore then redisstore", func(t *testing.T) { f(t, r, g) })
		})
	}
}

// key returns a key no other subtest uses.
func key(name string) string { return name + ":" + rand.Text()[:8] }

// TestAcquireThenFinishElsewhere: an entry acquired by one store is in
// flight for the other, which extends and completes it for its owner;
// both then replay the record, and the completion resent through the
// first store is taken as the resend it is.
func TestAcquireThenFinishElsewhere(t *testing.T) {
	each(t, func(t *testing.T, a, b named) {
		ctx := t.Context()
		k := key("finish")
		start := time.Now()
		if res, err := a.Acquire(ctx, k, "o1", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatalf("%s acquires: %+v, %v", a.name, res, err)
		}
		res, err := b.Acquire(ctx, k, "o2", "other-fp", time.Minute)
		// The lease left is a minute less the time between the two
		// acquires, at most what the test took for them (to the
		// millisecond Redis counts in), however slow the machine.
		least := time.Minute - time.Since(start) - time.Millisecond
		if err != nil || res.State != storage.InFlight || res.Fingerprint != "fp" || res.LeaseLeft < least || res.LeaseLeft > time.Minute {
			t.Fatalf("%s acquires the same key: %+v, %v; want in flight, fingerprint fp, %v to a minute left", b.name, res, err, least)
		}
		if res, err := b.Acquire(ctx, k, "o1", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatalf("%s acquires again for the owner: %+v, %v; want acquired (a resend)", b.name, res, err)
		}
		if err := b.Extend(ctx, k, "o1", 2*time.Minute); err != nil {
			t.Fatalf("%s extends: %v", b.name, err)
		}
		if err := b.Extend(ctx, k, "o2", time.Minute); !errors.Is(err, storage.ErrNotOwner) {
			t.Fatalf("%s extends for another owner: %v, want ErrNotOwner", b.name, err)
		}
		rec := []byte("201 Created\x00\xffbinary")
		if err := b.Complete(ctx, k, "o1", rec, time.Hour); err != nil {
			t.Fatalf("%s completes: %v", b.name, err)
		}
		if err := a.Complete(ctx, k, "o1", rec, time.Hour); err != nil {
			t.Fatalf("%s resends the completion: %v, want nil", a.name, err)
		}
		if err := a.Complete(ctx, k, "o2", rec, time.Hour); !errors.Is(err, storage.ErrNotOwner) {
			t.Fatalf("%s completes for another owner: %v, want ErrNotOwner", a.name, err)
		}
		for _, s := range []named{a, b} {
			res, err := s.Acquire(ctx, k, "o3", "fp", time.Minute)
			if err != nil || res.State != storage.Done || res.Fingerprint != "fp" || string(res.Record) != string(rec) {
				t.Fatalf("%s replays: %+v, %v; want done with the record", s.name, res, err)
			}
		}
	})
}

// TestReleaseElsewhere: an entry acquired by one store is released by the
// other, and acquired afresh.
func TestReleaseElsewhere(t *testing.T) {
	each(t, func(t *testing.T, a, b named) {
		ctx := t.Context()
		k := key("release")
		if res, err := a.Acquire(ctx, k, "o1", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatalf("%s acquires: %+v, %v", a.name, res, err)
		}
		if err := b.Release(ctx, k, "o2"); !errors.Is(err, storage.ErrNotOwner) {
			t.Fatalf("%s releases for another owner: %v, want ErrNotOwner", b.name, err)
		}
		if err := b.Release(ctx, k, "o1"); err != nil {
			t.Fatalf("%s releases: %v", b.name, err)
		}
		if res, err := a.Acquire(ctx, k, "o2", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatalf("%s acquires the released key: %+v, %v", a.name, res, err)
		}
	})
}

// TestIssueThenTakeElsewhere: a key issued by one store is taken by the
// other; released by the first, it is issued again, and taken again by
// the second, completed and replayed by the first.
func TestIssueThenTakeElsewhere(t *testing.T) {
	each(t, func(t *testing.T, a, b named) {
		ctx := t.Context()
		k := key("issue")
		if err := a.Issue(ctx, k, time.Hour); err != nil {
			t.Fatalf("%s issues: %v", a.name, err)
		}
		if err := b.Issue(ctx, k, time.Hour); !errors.Is(err, storage.ErrExists) {
			t.Fatalf("%s issues the same key: %v, want ErrExists", b.name, err)
		}
		if res, err := b.AcquireIssued(ctx, "never-"+k, "o1", "fp", time.Minute); err != nil || res.State != storage.NotIssued {
			t.Fatalf("%s takes a key never issued: %+v, %v; want not issued", b.name, res, err)
		}
		if res, err := b.AcquireIssued(ctx, k, "o1", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatalf("%s takes the issued key: %+v, %v", b.name, res, err)
		}
		if err := a.Release(ctx, k, "o1"); err != nil {
			t.Fatalf("%s releases the taken key: %v", a.name, err)
		}
		if e, err := b.Lookup(ctx, k, false); err != nil || e.State != storage.Issued || time.Until(e.Expires) <= 59*time.Minute {
			t.Fatalf("%s looks the released key up: %+v, %v; want issued again for the issue's hour", b.name, e, err)
		}
		if res, err := b.AcquireIssued(ctx, k, "o2", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatalf("%s takes the key again: %+v, %v", b.name, res, err)
		}
		if err := a.Complete(ctx, k, "o2", []byte("rec"), time.Hour); err != nil {
			t.Fatalf("%s completes: %v", a.name, err)
		}
		if res, err := b.AcquireIssued(ctx, k, "o3", "fp", time.Minute); err != nil || res.State != storage.Done || string(res.Record) != "rec" {
			t.Fatalf("%s replays: %+v, %v; want done", b.name, res, err)
		}
	})
}

// TestInspectElsewhere: the entries one store wrote, in every state, are
// looked up, listed and removed by the other.
func TestInspectElsewhere(t *testing.T) {
	each(t, func(t *testing.T, a, b named) {
		ctx := t.Context()
		inFlight, done, issued := key("in-flight"), key("done"), key("issued")
		if _, err := a.Acquire(ctx, inFlight, "o1", "fp1", time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Acquire(ctx, done, "o2", "fp2", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := a.Complete(ctx, done, "o2", []byte("the record"), time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := a.Issue(ctx, issued, time.Hour); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			key   string
			state storage.State
			fp    string
		}{{inFlight, storage.InFlight, "fp1"}, {done, storage.Done, "fp2"}, {issued, storage.Issued, ""}} {
			seen, err := a.Lookup(ctx, c.key, true)
			if err != nil {
				t.Fatal(err)
			}
			e, err := b.Lookup(ctx, c.key, true)
			if err != nil || e.Key != c.key || e.State != c.state || e.Fingerprint != c.fp || !e.Since.Equal(seen.Since) ||
				e.Size != seen.Size || string(e.Record) != string(seen.Record) {
				t.Fatalf("%s looks up %s's %v entry: %+v, %v; want what %s sees, %+v", b.name, a.name, c.state, e, err, a.name, seen)
			}
		}
		var listed []string
		q := storage.Query{Limit: 1000}
		for {
			page, err := b.List(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range page.Entries {
				listed = append(listed, e.Key)
			}
			if page.Next == "" {
				break
			}
			q.Cursor = page.Next
		}
		for _, k := range []string{inFlight, done, issued} {
			if !slices.Contains(listed, k) {
				t.Errorf("%s lists %q, without %s's %s", b.name, listed, a.name, k)
			}
		}
		shown, err := a.Lookup(ctx, inFlight, false) // the version one store shows, the other removes by
		if err != nil {
			t.Fatal(err)
		}
		if e, err := b.Remove(ctx, inFlight, shown.Version); err != nil || e.State != storage.InFlight {
			t.Fatalf("%s removes %s's entry in flight: %+v, %v", b.name, a.name, e, err)
		}
		if err := a.Complete(ctx, inFlight, "o1", []byte("late"), time.Hour); !errors.Is(err, storage.ErrNotOwner) {
			t.Fatalf("%s completes the removed entry: %v, want ErrNotOwner", a.name, err)
		}
	})
}

// TestRaceAcrossStores: both stores acquire the same keys at once, with
// owners of their own: exactly one wins each key, whichever store it ran
// on, and the other finds it in flight.
func TestRaceAcrossStores(t *testing.T) {
	each(t, func(t *testing.T, a, b named) {
		ctx := t.Context()
		const keys = 50
		base := key("race")
		states := make([][2]storage.State, keys)
		var wg sync.WaitGroup
		for i := range keys {
			for j, s := range []named{a, b} {
				wg.Go(func() {
					res, err := s.Acquire(ctx, base+":"+strconv.Itoa(i), s.name, "fp", time.Minute)
					if err != nil {
						t.Errorf("%s acquires: %v", s.name, err)
					}
					states[i][j] = res.State
				})
			}
		}
		wg.Wait()
		for i, st := range states {
			if !(st == [2]storage.State{storage.Acquired, storage.InFlight} || st == [2]storage.State{storage.InFlight, storage.Acquired}) {
				t.Errorf("key %d: %s %v, %s %v; want one acquired, the other in flight", i, a.name, st[0], b.name, st[1])
			}
		}
	})
}

// TestSameEvictionError: errors.Is matches either store's refusal with
// either store's ErrEvictionPolicy.
func TestSameEvictionError(t *testing.T) {
	if redisstore.ErrEvictionPolicy != rueidisstore.ErrEvictionPolicy {
		t.Fatal("redisstore.ErrEvictionPolicy and rueidisstore.ErrEvictionPolicy are two values")
	}
}
