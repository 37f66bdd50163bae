package memstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/testclock"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/storagetest"
)

// leakcheck fails the package if a janitor outlives its Close.
func TestMain(m *testing.M) { leakcheck.Main(m) }

func newStore(t *testing.T, opts ...Option) (*Store, *testclock.Clock) {
	clk := testclock.New(time.Unix(1_700_000_000, 0))
	s := New(append([]Option{WithClock(clk.Now)}, opts...)...)
	t.Cleanup(func() { s.Close() })
	return s, clk
}

// shardCounts are the shard counts the tests run with: the default, one
// (exact eviction order) and many (a few entries in each).
var shardCounts = []struct {
	name string
	n    int
}{{"default", 0}, {"one", 1}, {"many", 64}}

// storeMax is the WithMaxRecordBytes of the contract suite's stores.
const storeMax = 1<<20 + 1024

func TestContract(t *testing.T) {
	for _, c := range shardCounts {
		t.Run(c.name, func(t *testing.T) {
			storagetest.Run(t, func(t *testing.T) storagetest.Harness {
				s, clk := newStore(t, WithShards(c.n), WithMaxRecordBytes(storeMax))
				return storagetest.Harness{Store: s, Advance: clk.Advance, MaxRecord: storeMax}
			})
		})
	}
}

func TestContractSmallBound(t *testing.T) {
	// The tightest bound the suite fits in (Invalid/Acquire holds four
	// keys in flight): done entries are evicted all along, and that must
	// not get in the way of the contract.
	for _, c := range shardCounts {
		t.Run(c.name, func(t *testing.T) {
			storagetest.Run(t, func(t *testing.T) storagetest.Harness {
				s, clk := newStore(t, WithMaxEntries(4), WithShards(c.n))
				t.Cleanup(func() { s.checkInvariants(t) })
				return storagetest.Harness{Store: s, Advance: clk.Advance}
			})
		})
	}
}

func acquire(t *testing.T, s *Store, key, owner string, lease time.Duration) storage.Result {
	t.Helper()
	res, err := s.Acquire(t.Context(), key, owner, "fp", lease)
	if err != nil {
		t.Fatalf("Acquire(%q, %q): %v", key, owner, err)
	}
	return res
}

func complete(t *testing.T, s *Store, key string, ttl time.Duration) {
	t.Helper()
	if err := s.Complete(t.Context(), key, "o", []byte("rec-"+key), ttl); err != nil {
		t.Fatalf("Complete(%q): %v", key, err)
	}
}

// holds reports whether the store has key, without the side effects of
// Acquire.
func (s *Store) holds(key string) bool {
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	_, ok := sh.entries[key]
	return ok
}

func TestBoundNeverEvictsInFlight(t *testing.T) {
	s, clk := newStore(t, WithMaxEntries(3), WithShards(1))
	for i := range 3 {
		acquire(t, s, fmt.Sprint("p", i), "o", time.Minute)
	}
	lenBefore, bytesBefore := s.Len(), s.Bytes()
	_, err := s.Acquire(t.Context(), "p3", "o", "fp", time.Minute)
	if !errors.Is(err, storage.ErrFull) {
		t.Fatalf("Acquire on a store full of entries in flight: %v, want ErrFull", err)
	}
	if s.Len() != lenBefore || s.Bytes() != bytesBefore || s.holds("p3") {
		t.Fatal("a refused Acquire changed the store")
	}
	for i := range 3 {
		if res := acquire(t, s, fmt.Sprint("p", i), "other", time.Minute); res.State != storage.InFlight {
			t.Fatalf("p%d is %v: evicted while in flight", i, res.State)
		}
	}
	// Owners may still renew and complete: only new keys are refused.
	acquire(t, s, "p0", "o", time.Minute)
	complete(t, s, "p0", time.Hour)
	if res := acquire(t, s, "p3", "o", time.Minute); res.State != storage.Acquired {
		t.Fatalf("p3 after p0 completed: %v, want Acquired (evicting done p0)", res.State)
	}
	if s.holds("p0") {
		t.Fatal("done p0 was not the one evicted")
	}
	clk.Advance(2 * time.Minute) // the leases ran out: those entries may go
	if res := acquire(t, s, "p4", "o", time.Minute); res.State != storage.Acquired {
		t.Fatalf("after the leases ran out: %v", res.State)
	}
	if s.Len() != 1 {
		t.Fatalf("Len %d, want 1: making room drops every expired entry", s.Len())
	}
	s.checkInvariants(t)
}

func TestBoundDropsExpiredBeforeEvicting(t *testing.T) {
	s, clk := newStore(t, WithMaxEntries(4), WithShards(1))
	acquire(t, s, "done-long", "o", time.Minute) // completed first: oldest
	complete(t, s, "done-long", time.Hour)
	acquire(t, s, "done-short", "o", time.Minute) // completed later, expires sooner
	complete(t, s, "done-short", time.Second)
	acquire(t, s, "lease-short", "o", time.Second)
	acquire(t, s, "lease-long", "o", time.Hour)
	clk.Advance(2 * time.Second)

	acquire(t, s, "new1", "o", time.Hour)
	if !s.holds("done-long") {
		t.Fatal("evicted the oldest done entry while expired entries were there to drop")
	}
	if s.holds("done-short") || s.holds("lease-short") {
		t.Fatal("expired entries were not dropped")
	}
	acquire(t, s, "new2", "o", time.Hour)
	if s.Len() != 4 || !s.holds("done-long") {
		t.Fatalf("Len %d after filling the room freed by expired entries", s.Len())
	}
	acquire(t, s, "new3", "o", time.Hour) // now the oldest done entry goes
	if s.holds("done-long") || !s.holds("lease-long") {
		t.Fatal("want done-long evicted, lease-long kept")
	}
	s.checkInvariants(t)
}

func TestBoundEvictsOldestCompletedFirst(t *testing.T) {
	s, _ := newStore(t, WithMaxEntries(3), WithShards(1))
	for _, k := range []string{"a", "b", "c"} {
		acquire(t, s, k, "o", time.Minute)
	}
	// Completion order differs from acquisition order and from expiry
	// order: c, a, b.
	complete(t, s, "c", 3*time.Hour)
	complete(t, s, "a", time.Hour)
	complete(t, s, "b", 2*time.Hour)
	for i, want := range []string{"c", "a", "b"} {
		acquire(t, s, fmt.Sprint("new", i), "o", time.Minute)
		if s.holds(want) {
			t.Fatalf("eviction %d: %s still there, want it evicted (oldest completed)", i+1, want)
		}
		s.checkInvariants(t)
	}
	if _, err := s.Acquire(t.Context(), "one-more", "o", "", time.Minute); !errors.Is(err, storage.ErrFull) {
		t.Fatalf("only entries in flight remain: %v, want ErrFull", err)
	}
}

func TestExpiredIsAbsentBeforeTheJanitorRuns(t *testing.T) {
	s, clk := newStore(t)
	acquire(t, s, "k", "o1", time.Second)
	clk.Advance(time.Second)
	if s.Len() != 1 {
		t.Fatal("setup: the janitor ran")
	}
	if res := acquire(t, s, "k", "o2", time.Minute); res.State != storage.Acquired {
		t.Fatalf("expired entry: %v, want Acquired", res.State)
	}
}

func TestSweepAndBytes(t *testing.T) {
	s, clk := newStore(t)
	acquire(t, s, "a", "owner", time.Minute)
	acquire(t, s, "bb", "owner", time.Hour)
	if got, want := s.Bytes(), len("a"+"fp"+"owner")+len("bb"+"fp"+"owner"); got != want {
		t.Fatalf("Bytes %d, want %d", got, want)
	}
	if err := s.Complete(t.Context(), "bb", "owner", []byte("0123456789"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, want := s.Bytes(), len("a"+"fp"+"owner")+len("bb"+"fp"+"owner")+10; got != want {
		t.Fatalf("Bytes after Complete %d, want %d (owner kept, record added)", got, want)
	}
	clk.Advance(2 * time.Minute)
	s.sweep()
	if s.Len() != 1 || s.Bytes() != len("bb"+"fp"+"owner")+10 {
		t.Fatalf("after the lease: Len %d Bytes %d", s.Len(), s.Bytes())
	}
	clk.Advance(2 * time.Hour)
	s.sweep()
	if s.Len() != 0 || s.Bytes() != 0 {
		t.Fatalf("after the TTL: Len %d Bytes %d", s.Len(), s.Bytes())
	}
	s.checkInvariants(t)
}

// TestSweepFollowsChangedExpiry checks that renewing, extending and
// completing move an entry to its new place in expiry order.
func TestSweepFollowsChangedExpiry(t *testing.T) {
	s, clk := newStore(t)
	acquire(t, s, "renewed", "o", time.Minute)
	acquire(t, s, "extended", "o", time.Minute)
	acquire(t, s, "completed", "o", time.Minute)
	acquire(t, s, "shortened", "o", 3*time.Hour)
	acquire(t, s, "plain", "o", time.Hour)
	acquire(t, s, "renewed", "o", 2*time.Hour)
	if err := s.Extend(t.Context(), "extended", "o", 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	complete(t, s, "completed", 2*time.Hour)
	if err := s.Extend(t.Context(), "shortened", "o", time.Second); err != nil {
		t.Fatal(err)
	}
	s.checkInvariants(t)
	clk.Advance(90 * time.Minute)
	s.sweep()
	for k, want := range map[string]bool{"renewed": true, "extended": true, "completed": true, "shortened": false, "plain": false} {
		if s.holds(k) != want {
			t.Errorf("%s held %v after 90 minutes, want %v", k, !want, want)
		}
	}
}

// TestJanitor runs the real janitor goroutine on synctest's fake clock:
// it frees expired entries on its interval, and not after Close.
func TestJanitor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(WithCleanupInterval(time.Minute)) // time.Now is the bubble's clock
		acquire(t, s, "lease", "o", time.Second)
		acquire(t, s, "done", "o", time.Second)
		complete(t, s, "done", 30*time.Second)

		time.Sleep(59 * time.Second)
		synctest.Wait()
		if s.Len() != 2 {
			t.Fatalf("Len %d before the first sweep, want 2 (expired, not freed yet)", s.Len())
		}
		time.Sleep(time.Second)
		synctest.Wait() // the janitor has swept and is blocked again
		if s.Len() != 0 || s.Bytes() != 0 {
			t.Fatalf("after the janitor ran: Len %d Bytes %d, want 0", s.Len(), s.Bytes())
		}

		s.Close()
		acquire(t, s, "after-close", "o", time.Second)
		time.Sleep(time.Hour)
		synctest.Wait()
		if s.Len() != 1 {
			t.Fatal("the janitor still ran after Close")
		}
		// synctest.Test fails if a goroutine of the bubble is left running.
	})
}

func TestCloseIdempotentAndConcurrent(t *testing.T) {
	s := New(WithCleanupInterval(time.Millisecond))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The store stays usable, and leakcheck (TestMain) checks the janitor
	// is gone.
	if res := acquire(t, s, "k", "o", time.Minute); res.State != storage.Acquired {
		t.Fatalf("Acquire after Close: %v", res.State)
	}
}

func TestOptionDefaults(t *testing.T) {
	s := New(WithMaxEntries(0), WithMaxEntries(-1), WithCleanupInterval(0), WithCleanupInterval(-time.Second), WithClock(nil), nil)
	defer s.Close()
	if s.max != DefaultMaxEntries || s.cleanupEvery != DefaultCleanupInterval || s.now == nil {
		t.Fatalf("max %d, cleanup %v, clock %v: invalid values must keep the defaults", s.max, s.cleanupEvery, s.now != nil)
	}
	s2 := New(WithMaxEntries(7), WithCleanupInterval(time.Second))
	defer s2.Close()
	if s2.max != 7 || s2.cleanupEvery != time.Second {
		t.Fatalf("max %d, cleanup %v", s2.max, s2.cleanupEvery)
	}
}

func TestAllocations(t *testing.T) {
	s, _ := newStore(t)
	const runs = 500
	keys := make([]string, runs+1) // AllocsPerRun runs once more to warm up
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
	}
	rec := make([]byte, 1000)
	ctx := t.Context()

	i := 0
	if n := testing.AllocsPerRun(runs, func() {
		s.Acquire(ctx, keys[i], "owner", "fp", time.Minute)
		i++
	}); n > 1 {
		t.Errorf("Acquire of a new key: %v allocations, want 1 (the entry; growth amortised)", n)
	}
	i = 0
	if n := testing.AllocsPerRun(runs, func() {
		s.Complete(ctx, keys[i], "owner", rec, time.Hour)
		i++
	}); n != 1 {
		t.Errorf("Complete: %v allocations, want 1 (the copy of the record)", n)
	}
	var first storage.Result
	if n := testing.AllocsPerRun(runs, func() {
		first, _ = s.Acquire(ctx, keys[0], "other", "fp", time.Minute)
	}); n != 0 {
		t.Errorf("Acquire of a done entry: %v allocations, want 0", n)
	}
	again, _ := s.Acquire(ctx, keys[0], "other", "fp", time.Minute)
	if first.State != storage.Done || &first.Record[0] != &again.Record[0] {
		t.Error("Acquire of a done entry copied the record; it should return the stored slice")
	}

	issued := make([]string, runs+1)
	for i := range issued {
		issued[i] = fmt.Sprint("issued-", i)
	}
	i = 0
	if n := testing.AllocsPerRun(runs, func() {
		s.Issue(ctx, issued[i], time.Hour)
		i++
	}); n > 1 {
		t.Errorf("Issue: %v allocations, want 1 (the entry; growth amortised)", n)
	}
	i = 0
	if n := testing.AllocsPerRun(runs, func() {
		s.AcquireIssued(ctx, issued[i], "owner", "fp", time.Minute)
		i++
	}); n != 0 {
		t.Errorf("AcquireIssued of an issued entry: %v allocations, want 0", n)
	}
	i = 0
	if n := testing.AllocsPerRun(runs, func() {
		s.Release(ctx, issued[i], "owner")
		i++
	}); n != 0 {
		t.Errorf("Release of an entry taken from an issue: %v allocations, want 0", n)
	}
}

// TestBoundIssued: an issued entry takes a place like any other; the
// bound evicts issued entries first, in the order they became issued (a
// release back to issued counts as new), then done entries, and never an
// entry in flight, whether it came from an issue or not.
func TestBoundIssued(t *testing.T) {
	s, _ := newStore(t, WithMaxEntries(3), WithShards(1))
	ctx := t.Context()
	issue := func(key string) {
		t.Helper()
		if err := s.Issue(ctx, key, time.Hour); err != nil {
			t.Fatalf("Issue(%q): %v", key, err)
		}
	}
	issue("i1")
	acquire(t, s, "d", "o", time.Minute)
	complete(t, s, "d", time.Hour)
	issue("i2")
	if res, err := s.AcquireIssued(ctx, "i1", "o", "fp", time.Minute); err != nil || res.State != storage.Acquired {
		t.Fatalf("AcquireIssued(i1): %+v, %v", res, err)
	}
	if err := s.Release(ctx, "i1", "o"); err != nil { // issued again: now the newest
		t.Fatal(err)
	}
	for _, want := range []string{"i2", "i1", "d"} {
		acquire(t, s, "new-"+want, "o", time.Minute)
		if s.holds(want) {
			t.Fatalf("%s still there, want it evicted next", want)
		}
		s.checkInvariants(t)
	}
	// Full of entries in flight: Issue refuses, as Acquire does.
	if err := s.Issue(ctx, "i3", time.Hour); !errors.Is(err, storage.ErrFull) {
		t.Fatalf("Issue on a store full of entries in flight: %v, want ErrFull", err)
	}
	if s.holds("i3") || s.Len() != 3 {
		t.Fatal("a refused Issue changed the store")
	}
	// An entry taken from an issue is in flight: never evicted.
	s2, _ := newStore(t, WithMaxEntries(1), WithShards(1))
	if err := s2.Issue(ctx, "k", time.Hour); err != nil {
		t.Fatal(err)
	}
	if res, _ := s2.AcquireIssued(ctx, "k", "o", "fp", time.Minute); res.State != storage.Acquired {
		t.Fatalf("AcquireIssued: %v", res.State)
	}
	if _, err := s2.Acquire(ctx, "other", "o", "fp", time.Minute); !errors.Is(err, storage.ErrFull) {
		t.Fatalf("Acquire beside an entry in flight taken from an issue: %v, want ErrFull", err)
	}
	s.checkInvariants(t)
	s2.checkInvariants(t)
}

// TestIssuedBytes: Bytes counts an issued entry's key, then its owner and
// fingerprint while taken, and the key alone again once released.
func TestIssuedBytes(t *testing.T) {
	s, _ := newStore(t)
	ctx := t.Context()
	if err := s.Issue(ctx, "key", time.Hour); err != nil {
		t.Fatal(err)
	}
	if s.Bytes() != len("key") {
		t.Fatalf("Bytes %d after Issue, want %d", s.Bytes(), len("key"))
	}
	s.AcquireIssued(ctx, "key", "owner", "fingerprint", time.Minute)
	if want := len("key") + len("owner") + len("fingerprint"); s.Bytes() != want {
		t.Fatalf("Bytes %d after AcquireIssued, want %d", s.Bytes(), want)
	}
	s.Release(ctx, "key", "owner")
	if s.Bytes() != len("key") {
		t.Fatalf("Bytes %d after Release, want %d", s.Bytes(), len("key"))
	}
	s.checkInvariants(t)
}

// TestRandomOperations runs random operations from several goroutines on
// a few keys with a small bound, checking the internal invariants (map,
// expiry heap, list of done and issued entries and byte count agree) as it
// goes.
func TestRandomOperations(t *testing.T) {
	for _, c := range shardCounts {
		t.Run(c.name, func(t *testing.T) { testRandomOperations(t, c.n) })
	}
}

func testRandomOperations(t *testing.T, shards int) {
	s, clk := newStore(t, WithMaxEntries(6), WithShards(shards))
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	owners := []string{"o0", "o1", "o2"}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			ctx := t.Context()
			for range 2000 {
				k, o := keys[r.IntN(len(keys))], owners[r.IntN(len(owners))]
				d := time.Duration(1+r.IntN(3000)) * time.Millisecond
				var err error
				switch r.IntN(8) {
				case 0, 1:
					_, err = s.Acquire(ctx, k, o, k, d)
				case 2:
					err = s.Complete(ctx, k, o, []byte(k+o), d)
				case 3:
					err = s.Release(ctx, k, o)
				case 4:
					err = s.Extend(ctx, k, o, d)
				case 5:
					clk.Advance(time.Duration(r.IntN(500)) * time.Millisecond)
					if r.IntN(10) == 0 {
						s.sweep()
					}
				case 6:
					err = s.Issue(ctx, k, d)
				case 7:
					_, err = s.AcquireIssued(ctx, k, o, k, d)
				}
				if err != nil && !errors.Is(err, storage.ErrNotOwner) && !errors.Is(err, storage.ErrFull) && !errors.Is(err, storage.ErrExists) {
					t.Errorf("unexpected error: %v", err)
					return
				}
				s.checkShards(t, false)
			}
		})
	}
	wg.Wait()
	s.checkInvariants(t)
}

// checkInvariants checks that, in every shard, the map, the expiry heap,
// the lists of done and issued entries, the byte count and what the shard
// published agree, and that the global count is the number of entries in
// all shards and within the bound. No call may run meanwhile: while calls
// run, use checkShards.
func (s *Store) checkInvariants(t *testing.T) {
	t.Helper()
	s.checkShards(t, true)
}

// checkShards checks each shard, one at a time; atRest, when no call
// runs, it checks the global count too.
func (s *Store) checkShards(t *testing.T, atRest bool) {
	t.Helper()
	total := 0
	for i := range s.shards {
		total += s.shards[i].check(t, s)
	}
	if n := s.count.Load(); atRest && n != int64(total) {
		t.Fatalf("count %d, shards hold %d entries", n, total)
	}
	if atRest && total > s.max {
		t.Errorf("%d entries over the bound of %d", total, s.max)
	}
}

// check checks the shard's invariants and returns its number of entries.
func (sh *shard) check(t *testing.T, s *Store) int {
	t.Helper()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if len(sh.entries) > s.max {
		t.Errorf("%d entries over the bound of %d", len(sh.entries), s.max)
	}
	if sh.byExpiry.Len() != len(sh.entries) {
		t.Fatalf("heap holds %d entries, map %d", sh.byExpiry.Len(), len(sh.entries))
	}
	size := 0
	for i, it := range sh.byExpiry.items {
		e := it.e
		if e.index != i || sh.entries[e.key] != e || s.shardOf(e.key) != sh {
			t.Fatalf("heap[%d] = %q with index %d, not the map's entry", i, e.key, e.index)
		}
		if it.at != e.expires.Sub(s.epoch) {
			t.Fatalf("heap[%d] = %q: key %v, its expiry is at %v", i, e.key, it.at, e.expires.Sub(s.epoch))
		}
		if i > 0 && e.expires.Before(sh.byExpiry.items[(i-1)/arity].e.expires) {
			t.Fatalf("heap order broken at %d", i)
		}
		if e.done != (e.record != nil) || (e.done && (e.owner == "" || e.issueTTL != 0)) {
			t.Fatalf("entry %q: done %v, owner %q, record %v, issue TTL %v", e.key, e.done, e.owner, e.record != nil, e.issueTTL)
		}
		if !e.done && e.owner == "" && (e.fingerprint != "" || e.issueTTL <= 0) {
			t.Fatalf("issued entry %q: fingerprint %q, issue TTL %v", e.key, e.fingerprint, e.issueTTL)
		}
		size += e.size()
	}
	if size != sh.bytes {
		t.Fatalf("Bytes %d, entries hold %d", sh.bytes, size)
	}
	earliest := int64(math.MaxInt64)
	if len(sh.byExpiry.items) > 0 {
		earliest = int64(sh.byExpiry.items[0].at)
	}
	if sh.earliest.Load() != earliest || sh.nIssued.Load() != int64(sh.issued.n) || sh.nDone.Load() != int64(sh.done.n) {
		t.Fatalf("shard %d published earliest %d, %d issued, %d done; holds %d, %d, %d",
			sh.idx, sh.earliest.Load(), sh.nIssued.Load(), sh.nDone.Load(), earliest, sh.issued.n, sh.done.n)
	}
	for _, l := range []struct {
		name string
		list *evictList
		in   func(*entry) bool
	}{
		{"issued", &sh.issued, func(e *entry) bool { return !e.done && e.owner == "" }},
		{"done", &sh.done, func(e *entry) bool { return e.done }},
	} {
		listed := 0
		for e, prev := l.list.oldest, (*entry)(nil); e != nil; prev, e = e, e.next {
			if !l.in(e) || e.prev != prev || sh.entries[e.key] != e {
				t.Fatalf("list of %s entries broken at %q", l.name, e.key)
			}
			if e.next == nil && l.list.newest != e {
				t.Fatalf("list of %s entries: newest is not the last", l.name)
			}
			listed++
		}
		if listed != l.list.n {
			t.Fatalf("list of %s entries holds %d, counts %d", l.name, listed, l.list.n)
		}
		if l.list.oldest == nil && l.list.newest != nil {
			t.Fatalf("list of %s entries: empty, with a newest", l.name)
		}
		for _, e := range sh.entries {
			if l.in(e) {
				listed--
			}
		}
		if listed != 0 {
			t.Fatalf("list of %s entries and map disagree by %d", l.name, listed)
		}
	}
	return len(sh.entries)
}

// TestExpiryHeap pushes, fixes and removes entries at random and checks
// after each step that the heap is ordered, every entry knows its index,
// and the minimum is the soonest expiry.
func TestExpiryHeap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	base := time.Unix(1_700_000_000, 0)
	h := &expiryHeap{epoch: base}
	at := func() time.Time { return base.Add(time.Duration(rng.IntN(1000)) * time.Millisecond) }
	for step := range 5000 {
		switch op := rng.IntN(4); {
		case op == 0 || h.Len() == 0:
			h.push(&entry{expires: at()})
		case op == 1:
			i := rng.IntN(h.Len())
			h.items[i].e.expires = at()
			h.items[i].at = h.items[i].e.expires.Sub(base)
			h.fix(i)
		default:
			h.remove(rng.IntN(h.Len()))
		}
		for i, it := range h.items {
			if it.e.index != i || it.at != it.e.expires.Sub(base) {
				t.Fatalf("step %d: heap[%d] has index %d", step, i, it.e.index)
			}
			if i > 0 && it.e.expires.Before(h.items[(i-1)/arity].e.expires) {
				t.Fatalf("step %d: order broken at %d", step, i)
			}
		}
	}
}

// TestIssueFloodKeepsDoneRecords: a flood of Issue calls (IssueKey serves
// every form load) on a bounded store must not evict a completed record,
// or a retry of that payment runs its handler again. Issued entries are
// evicted first, oldest first; every Issue succeeds.
func TestIssueFloodKeepsDoneRecords(t *testing.T) {
	const bound, flood = 1000, 100_000
	s, _ := newStore(t, WithMaxEntries(bound), WithShards(1))
	ctx := t.Context()
	acquire(t, s, "payment", "o", time.Minute)
	complete(t, s, "payment", time.Hour)
	for i := range flood {
		if err := s.Issue(ctx, fmt.Sprint("issued-", i), time.Hour); err != nil {
			t.Fatalf("Issue %d of %d: %v", i+1, flood, err)
		}
	}
	res := acquire(t, s, "payment", "retry", time.Minute)
	if res.State != storage.Done || string(res.Record) != "rec-payment" {
		t.Fatalf("the payment after %d Issue calls: %v with record %q, want done with %q (its retry would run again)", flood, res.State, res.Record, "rec-payment")
	}
	if s.Len() != bound {
		t.Fatalf("Len %d, want the bound %d", s.Len(), bound)
	}
	// The oldest issued entries went first: the newest are still there.
	if !s.holds(fmt.Sprint("issued-", flood-1)) || s.holds("issued-0") {
		t.Fatal("want the oldest issued entries evicted and the newest kept")
	}
	s.checkInvariants(t)
}

// BenchmarkFirstOnFullStore is a first execution's store calls (Acquire,
// then Complete of 200 bytes) on a store that already holds 100,000 done
// entries: the expiry heap's work at a realistic size.
func BenchmarkFirstOnFullStore(b *testing.B) {
	s := New()
	b.Cleanup(func() { s.Close() })
	ctx := context.Background()
	rec := make([]byte, 200)
	var n int
	next := func() string { n++; return "key-" + strconv.Itoa(n) }
	for range 100_000 {
		k := next()
		s.Acquire(ctx, k, "o", "fp", time.Minute)
		s.Complete(ctx, k, "o", rec, time.Hour)
	}
	b.ReportAllocs()
	for b.Loop() {
		k := next()
		if _, err := s.Acquire(ctx, k, "o", "fp", time.Minute); err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, k, "o", rec, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}

// TestListOldestFirst: List shows the entries oldest Since first, across
// pages, in flight, done and issued alike, and MinAge leaves out the
// younger ones.
func TestListOldestFirst(t *testing.T) {
	s, clock := newStore(t)
	ctx := context.Background()
	var want []string
	for i := range 7 {
		k := fmt.Sprintf("k%d", 6-i) // keys in the reverse order of age
		switch i % 3 {
		case 0:
			if err := s.Issue(ctx, k, time.Hour); err != nil {
				t.Fatal(err)
			}
		case 1:
			if _, err := s.Acquire(ctx, k, "o", "fp", time.Hour); err != nil {
				t.Fatal(err)
			}
		case 2:
			if _, err := s.Acquire(ctx, k, "o", "fp", time.Hour); err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, k, "o", []byte("r"), time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		want = append(want, k)
		clock.Advance(time.Second)
	}
	var got []string
	q := storage.Query{Limit: 2}
	for {
		p, err := s.List(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range p.Entries {
			got = append(got, e.Key)
		}
		if p.Next == "" {
			break
		}
		q.Cursor = p.Next
	}
	if !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v (oldest first)", got, want)
	}
	p, err := s.List(ctx, storage.Query{MinAge: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Entries) != 3 || p.Entries[0].Key != "k6" || p.Entries[2].Key != "k4" || p.Next != "" {
		t.Fatalf("entries at least 5s old: %+v, want k6, k5, k4", p)
	}
}

func TestWithShards(t *testing.T) {
	def := powerOfTwo(4*runtime.GOMAXPROCS(0), maxDefaultShards)
	for _, c := range []struct{ n, want int }{{0, def}, {-3, def}, {1, 1}, {3, 4}, {64, 64}, {65, 128}, {256, 256}, {1000, 256}} {
		s := New(WithShards(c.n))
		s.Close()
		if len(s.shards) != c.want || int(s.mask) != c.want-1 {
			t.Errorf("WithShards(%d): %d shards, want %d", c.n, len(s.shards), c.want)
		}
	}
	if def < 4 || def > 64 || def&(def-1) != 0 {
		t.Errorf("default of %d shards", def)
	}
}

// manyShards is a store of many shards with a small bound, with its keys
// spread over several shards: what still holds of the eviction order
// holds across shards.
func manyShards(t *testing.T, bound int) (*Store, *testclock.Clock) {
	t.Helper()
	s, clk := newStore(t, WithMaxEntries(bound), WithShards(64))
	return s, clk
}

// TestBoundManyShards: with many shards, expired entries go before live
// ones, issued entries before done ones, and never an entry in flight,
// wherever their shard; the bound holds; ErrFull comes only when every
// entry is in flight.
func TestBoundManyShards(t *testing.T) {
	const n = 10
	s, clk := manyShards(t, 3*n)
	ctx := t.Context()
	for i := range n {
		acquire(t, s, fmt.Sprint("done-", i), "o", time.Minute)
		complete(t, s, fmt.Sprint("done-", i), time.Hour)
		if err := s.Issue(ctx, fmt.Sprint("issued-", i), time.Hour); err != nil {
			t.Fatal(err)
		}
		acquire(t, s, fmt.Sprint("expiring-", i), "o", time.Second)
	}
	clk.Advance(time.Second)
	shards := map[*shard]bool{}
	for i := range n {
		shards[s.shardOf(fmt.Sprint("expiring-", i))] = true
	}
	if len(shards) < 2 {
		t.Fatal("setup: the expired entries are in one shard")
	}
	// Expired entries go first, wherever they are.
	for i := range n {
		acquire(t, s, fmt.Sprint("flight-", i), "o", time.Hour)
	}
	for i := range n {
		if !s.holds(fmt.Sprint("done-", i)) || !s.holds(fmt.Sprint("issued-", i)) {
			t.Fatalf("a live entry was evicted while expired ones were left (after %d)", i)
		}
	}
	s.checkInvariants(t)
	// Then issued entries, all of them before any done one.
	for i := range n {
		acquire(t, s, fmt.Sprint("flight2-", i), "o", time.Hour)
		for j := range n {
			if !s.holds(fmt.Sprint("done-", j)) {
				t.Fatalf("done-%d evicted while %d issued entries were left", j, n-1-i)
			}
		}
	}
	for i := range n {
		if s.holds(fmt.Sprint("issued-", i)) {
			t.Fatalf("issued-%d kept", i)
		}
	}
	// Then done ones; never one in flight.
	for i := range n {
		acquire(t, s, fmt.Sprint("flight3-", i), "o", time.Hour)
	}
	if s.Len() != 3*n {
		t.Fatalf("Len %d, want %d", s.Len(), 3*n)
	}
	for _, p := range []string{"flight-", "flight2-", "flight3-"} {
		for i := range n {
			if res := acquire(t, s, fmt.Sprint(p, i), "other", time.Hour); res.State != storage.InFlight {
				t.Fatalf("%s%d is %v, want in flight", p, i, res.State)
			}
		}
	}
	if _, err := s.Acquire(ctx, "one-more", "o", "fp", time.Hour); !errors.Is(err, storage.ErrFull) {
		t.Fatalf("every entry in flight: %v, want ErrFull", err)
	}
	if err := s.Issue(ctx, "one-more", time.Hour); !errors.Is(err, storage.ErrFull) {
		t.Fatalf("every entry in flight: Issue: %v, want ErrFull", err)
	}
	s.checkInvariants(t)
	// One completes: its shard or another, the next new key takes its place.
	complete(t, s, "flight3-0", time.Hour)
	if res := acquire(t, s, "last", "o", time.Hour); res.State != storage.Acquired || s.holds("flight3-0") {
		t.Fatalf("after one completed: %v, want it evicted and the new key acquired", res.State)
	}
	s.checkInvariants(t)
}

// TestIssueFloodManyShards: with many shards too, a flood of Issue calls
// never evicts a done record while an issued entry is left anywhere.
func TestIssueFloodManyShards(t *testing.T) {
	const bound, flood = 200, 20_000
	s, _ := manyShards(t, bound)
	ctx := t.Context()
	for i := range 10 {
		acquire(t, s, fmt.Sprint("payment-", i), "o", time.Minute)
		complete(t, s, fmt.Sprint("payment-", i), time.Hour)
	}
	for i := range flood {
		if err := s.Issue(ctx, fmt.Sprint("issued-", i), time.Hour); err != nil {
			t.Fatalf("Issue %d of %d: %v", i+1, flood, err)
		}
	}
	for i := range 10 {
		if res := acquire(t, s, fmt.Sprint("payment-", i), "retry", time.Minute); res.State != storage.Done {
			t.Fatalf("payment-%d after %d Issue calls: %v, want done", i, flood, res.State)
		}
	}
	if s.Len() != bound || !s.holds(fmt.Sprint("issued-", flood-1)) {
		t.Fatalf("Len %d, want the bound %d with the newest issued entry", s.Len(), bound)
	}
	s.checkInvariants(t)
}

// TestConcurrentBound: many goroutines on a small bound with many shards
// acquire, complete, issue, release and remove; each holds a key in
// flight meanwhile, which must never be evicted, and at rest the bound
// and the counts hold.
func TestConcurrentBound(t *testing.T) {
	const goroutines, rounds, bound = 32, 150, 64
	s, clk := newStore(t, WithMaxEntries(bound), WithShards(64))
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 2))
			ctx := t.Context()
			owner := fmt.Sprint("owner-", g)
			for i := range rounds {
				own := fmt.Sprintf("own-%d-%d", g, i)
				res, err := s.Acquire(ctx, own, owner, "fp", time.Hour)
				if errors.Is(err, storage.ErrFull) {
					continue // under the race, the entries another found may be gone
				}
				if err != nil || res.State != storage.Acquired {
					t.Errorf("Acquire(%s): %v, %v", own, res.State, err)
					return
				}
				other := fmt.Sprintf("k-%d-%d", g, r.IntN(rounds))
				switch r.IntN(6) {
				case 0:
					s.Issue(ctx, other, time.Duration(1+r.IntN(100))*time.Millisecond)
				case 1:
					if res, _ := s.AcquireIssued(ctx, other, owner, "fp", time.Hour); res.State == storage.Acquired {
						s.Release(ctx, other, owner)
					}
				case 2:
					if res, _ := s.Acquire(ctx, other, owner, "fp", time.Hour); res.State == storage.Acquired {
						s.Complete(ctx, other, owner, []byte("rec"), time.Duration(1+r.IntN(1000))*time.Millisecond)
					}
				case 3:
					if e, err := s.Lookup(ctx, other, false); err == nil {
						s.Remove(ctx, other, e.Version)
					}
				case 4:
					clk.Advance(time.Millisecond)
				case 5:
					if err := s.Issue(ctx, other, time.Hour); err == nil {
						s.AcquireIssued(ctx, other, owner, "fp", time.Hour)
						s.Release(ctx, other, owner)
					}
				}
				if res, err := s.Acquire(ctx, own, "someone-else", "fp", time.Hour); err != nil || res.State != storage.InFlight {
					t.Errorf("%s in flight: %v, %v: evicted", own, res.State, err)
					return
				}
				if r.IntN(2) == 0 {
					err = s.Complete(ctx, own, owner, []byte("rec"), time.Hour)
				} else {
					err = s.Release(ctx, own, owner)
				}
				if err != nil {
					t.Errorf("completing %s: %v", own, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := s.Len(); n > bound {
		t.Fatalf("Len %d over the bound of %d", n, bound)
	}
	s.checkInvariants(t)
}

// TestCreatedWhileMakingRoom: while Acquire or Issue makes room in another
// shard, its own shard is unlocked, and another call may create the key:
// then it answers as for an existing key and gives its place back.
func TestCreatedWhileMakingRoom(t *testing.T) {
	s, _ := newStore(t, WithMaxEntries(2), WithShards(64))
	ctx := t.Context()
	// Three keys in three shards.
	var keys []string
	used := map[*shard]bool{}
	for i := 0; len(keys) < 3; i++ {
		k := fmt.Sprint("k", i)
		if sh := s.shardOf(k); !used[sh] {
			used[sh] = true
			keys = append(keys, k)
		}
	}
	a, c, b := keys[0], keys[1], keys[2]
	for _, k := range []string{a, c} {
		if err := s.Issue(ctx, k, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	for _, call := range []struct {
		name string
		run  func() error
		want func(error) bool
	}{
		{"Acquire", func() error {
			res, err := s.Acquire(ctx, b, "o1", "fp1", time.Minute)
			if err == nil && (res.State != storage.InFlight || res.Fingerprint != "fp2") {
				return fmt.Errorf("%v with %q, want in flight with fp2", res.State, res.Fingerprint)
			}
			return err
		}, func(err error) bool { return err == nil }},
		{"Issue", func() error { return s.Issue(ctx, b, time.Hour) }, func(err error) bool { return errors.Is(err, storage.ErrExists) }},
	} {
		t.Run(call.name, func(t *testing.T) {
			hooked := false
			testHookUnlocked = func() {
				if hooked {
					return
				}
				hooked = true
				if res, err := s.Acquire(ctx, b, "o2", "fp2", time.Minute); err != nil || res.State != storage.Acquired {
					t.Errorf("the other Acquire: %v, %v", res.State, err)
				}
			}
			defer func() { testHookUnlocked = nil }()
			if err := call.run(); !call.want(err) {
				t.Fatalf("%s of a key created meanwhile: %v", call.name, err)
			}
			if !hooked {
				t.Fatal("setup: makeRoom did not unlock its shard")
			}
			if s.Len() > 2 {
				t.Fatalf("Len %d over the bound", s.Len())
			}
			s.checkInvariants(t)
			// Back to two issued entries and none else.
			s.Release(ctx, b, "o2")
			for _, k := range []string{a, c} {
				s.Issue(ctx, k, time.Hour)
			}
			if s.Len() != 2 || s.holds(b) {
				t.Fatalf("setup: Len %d", s.Len())
			}
		})
	}
}
