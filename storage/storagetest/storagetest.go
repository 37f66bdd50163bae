// Package storagetest is the contract suite of storage.Store. Every store
// of this module passes it, and so must a store written by a user:
//
//	func TestContract(t *testing.T) {
//		storagetest.Run(t, func(t *testing.T) storagetest.Harness {
//			return storagetest.Harness{Store: mystore.New(...)}
//		})
//	}
//
// It uses the standard testing package only.
package storagetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
)

// Harness is one store under test.
type Harness struct {
	// Store is the store under test. Each subtest uses keys of its own, so
	// one store may serve every subtest.
	Store storage.Store
	// Advance moves the store's clock forward (an injected clock,
	// miniredis's FastForward). Leave it nil when the clock cannot be moved,
	// as with a real Redis server: the expiry tests then use leases of a few
	// tens of milliseconds and poll, for at most two seconds.
	Advance func(d time.Duration)
}

// Run runs the contract suite. newHarness is called once per subtest.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			tc.run(t, &suite{Harness: h, t: t, ctx: context.Background()})
		})
	}
}

type suite struct {
	Harness
	t   *testing.T
	ctx context.Context
}

// key returns a key no other subtest uses.
func (s *suite) key() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "storagetest:" + hex.EncodeToString(b)
}

func (s *suite) acquire(key, owner, fp string, lease time.Duration) storage.Result {
	s.t.Helper()
	res, err := s.Store.Acquire(s.ctx, key, owner, fp, lease)
	if err != nil {
		s.t.Fatalf("Acquire(%q, %q): %v", key, owner, err)
	}
	return res
}

func (s *suite) mustState(res storage.Result, want storage.State) {
	s.t.Helper()
	if res.State != want {
		s.t.Fatalf("Acquire state %v, want %v (%+v)", res.State, want, res)
	}
}

func (s *suite) complete(key, owner string, rec []byte) {
	s.t.Helper()
	if err := s.Store.Complete(s.ctx, key, owner, rec, time.Hour); err != nil {
		s.t.Fatalf("Complete: %v", err)
	}
}

func (s *suite) is(err, want error, what string) {
	s.t.Helper()
	if !errors.Is(err, want) {
		s.t.Fatalf("%s: error %v, want %v", what, err, want)
	}
}

// expire lets a lease or TTL of d run out: by moving the clock, or by
// waiting for a real one, polling until probe reports true.
func (s *suite) expire(d time.Duration, probe func() bool) {
	s.t.Helper()
	if s.Advance != nil {
		s.Advance(d + time.Millisecond)
		if !probe() {
			s.t.Fatal("entry still there after its time ran out")
		}
		return
	}
	deadline := time.Now().Add(2 * time.Second)
	for !probe() {
		if time.Now().After(deadline) {
			s.t.Fatal("entry still there 2s after its time ran out")
		}
		time.Sleep(5 * time.Millisecond) // a real server's clock: nothing to wait on but time
	}
}

// short is a lease or TTL that runs out soon on a real clock, and is
// moved past with Advance otherwise.
func (s *suite) short() time.Duration {
	if s.Advance != nil {
		return time.Minute
	}
	return 50 * time.Millisecond
}

var cases = []struct {
	name string
	run  func(t *testing.T, s *suite)
}{
	{"AcquireNew", func(t *testing.T, s *suite) {
		s.mustState(s.acquire(s.key(), "o1", "fp", time.Minute), storage.Acquired)
	}},
	{"AcquireSameOwnerRenews", func(t *testing.T, s *suite) {
		k := s.key()
		s.mustState(s.acquire(k, "o1", "fp", time.Minute), storage.Acquired)
		s.mustState(s.acquire(k, "o1", "fp", time.Hour), storage.Acquired)
		res := s.acquire(k, "o2", "fp", time.Minute)
		s.mustState(res, storage.InFlight)
		if res.LeaseLeft <= time.Minute {
			t.Fatalf("lease left %v: the resent acquire did not renew the lease to an hour", res.LeaseLeft)
		}
	}},
	{"AcquireOtherOwnerInFlight", func(t *testing.T, s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp-1", time.Minute)
		res := s.acquire(k, "o2", "fp-2", time.Minute)
		s.mustState(res, storage.InFlight)
		if res.Fingerprint != "fp-1" || res.LeaseLeft < time.Millisecond || res.LeaseLeft > time.Minute || res.Record != nil {
			t.Fatalf("in flight result %+v", res)
		}
	}},
	{"AcquireDone", func(t *testing.T, s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", time.Minute)
		s.complete(k, "o1", []byte("record"))
		for _, owner := range []string{"o1", "o2"} {
			res := s.acquire(k, owner, "other", time.Minute)
			s.mustState(res, storage.Done)
			if res.Fingerprint != "fp" || string(res.Record) != "record" {
				t.Fatalf("done result %+v", res)
			}
		}
	}},
	{"CompleteByNonOwner", func(t *testing.T, s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", time.Minute)
		s.is(s.Store.Complete(s.ctx, k, "o2", []byte("x"), time.Hour), storage.ErrNotOwner, "Complete by another owner")
		s.mustState(s.acquire(k, "o3", "fp", time.Minute), storage.InFlight)
		s.is(s.Store.Complete(s.ctx, s.key(), "o1", []byte("x"), time.Hour), storage.ErrNotOwner, "Complete of a missing key")
	}},
	{"CompleteResend", func(t *testing.T, s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", time.Minute)
		s.complete(k, "o1", []byte("record"))
		if err := s.Store.Complete(s.ctx, k, "o1", []byte("record"), time.Hour); err != nil {
			t.Fatalf("resent Complete: %v", err)
		}
		s.is(s.Store.Complete(s.ctx, k, "o1", []byte("other"), time.Hour), storage.ErrNotOwner, "Complete with another record")
		if res := s.acquire(k, "o2", "", time.Minute); string(res.Record) != "record" {
			t.Fatalf("record changed to %q", res.Record)
		}
	}},
	{"CompleteDoesNotKeepCallerBuffer", func(t *testing.T, s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", time.Minute)
		buf := []byte("record")
		s.complete(k, "o1", buf)
		copy(buf, "XXXXXX")
		if res := s.acquire(k, "o2", "", time.Minute); string(res.Record) != "record" {
			t.Fatalf("stored record follows the caller's buffer: %q", res.Record)
		}
	}},
	{"ReleaseThenReacquire", func(t *testing.T, s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp-1", time.Minute)
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			t.Fatalf("Release: %v", err)
		}
		s.mustState(s.acquire(k, "o2", "fp-2", time.Minute), storage.Acquired)
		if res := s.acquire(k, "o3", "", time.Minute); res.Fingerprint != "fp-2" {
			t.Fatalf("fingerprint after re-acquire %q", res.Fingerprint)
		}
	}},
	{"ReleaseMissing", func(t *testing.T, s *suite) {
		if err := s.Store.Release(s.ctx, s.key(), "o1"); err != nil {
			t.Fatalf("Release of a missing key: %v", err)
		}
		k := s.key()
		s.acquire(k, "o1", "fp", time.Minute)
		s.Store.Release(s.ctx, k, "o1")
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			t.Fatalf("resent Release: %v", err)
		}
	}},
	{"ReleaseByNonOwner", func(t *testing.T, s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", time.Minute)
		s.is(s.Store.Release(s.ctx, k, "o2"), storage.ErrNotOwner, "Release by another owner")
		s.mustState(s.acquire(k, "o2", "fp", time.Minute), storage.InFlight)
		s.complete(k, "o1", []byte("r"))
		s.is(s.Store.Release(s.ctx, k, "o1"), storage.ErrNotOwner, "Release of a done entry")
		s.mustState(s.acquire(k, "o2", "fp", time.Minute), storage.Done)
	}},
	{"ExtendKeepsLease", func(t *testing.T, s *suite) {
		k := s.key()
		lease := s.short()
		s.acquire(k, "o1", "fp", lease)
		if err := s.Store.Extend(s.ctx, k, "o1", time.Hour); err != nil {
			t.Fatalf("Extend: %v", err)
		}
		if s.Advance != nil {
			s.Advance(2 * lease)
		} else {
			time.Sleep(2 * lease) // a real server's clock: the original lease must have passed
		}
		res := s.acquire(k, "o2", "fp", time.Minute)
		s.mustState(res, storage.InFlight)
		if res.LeaseLeft <= lease {
			t.Fatalf("lease left %v after Extend to an hour", res.LeaseLeft)
		}
	}},
	{"ExtendByNonOwner", func(t *testing.T, s *suite) {
		k := s.key()
		s.is(s.Store.Extend(s.ctx, k, "o1", time.Minute), storage.ErrNotOwner, "Extend of a missing key")
		s.acquire(k, "o1", "fp", time.Minute)
		s.is(s.Store.Extend(s.ctx, k, "o2", time.Minute), storage.ErrNotOwner, "Extend by another owner")
		s.complete(k, "o1", []byte("r"))
		s.is(s.Store.Extend(s.ctx, k, "o1", time.Minute), storage.ErrNotOwner, "Extend of a done entry")
	}},
	{"LeaseExpires", func(t *testing.T, s *suite) {
		k := s.key()
		lease := s.short()
		s.acquire(k, "o1", "fp", lease)
		n := 0
		s.expire(lease, func() bool {
			n++
			return s.acquire(k, "o2-"+strings.Repeat("x", n), "fp", time.Minute).State == storage.Acquired
		})
		s.is(s.Store.Complete(s.ctx, k, "o1", []byte("late"), time.Hour), storage.ErrNotOwner, "Complete after the lease expired")
		s.is(s.Store.Extend(s.ctx, k, "o1", time.Minute), storage.ErrNotOwner, "Extend after the lease expired")
	}},
	{"ExpiredLeaseCannotComplete", func(t *testing.T, s *suite) {
		k := s.key()
		lease := s.short()
		s.acquire(k, "o1", "fp", lease)
		// Releasing as nobody in particular changes nothing: it answers nil
		// once the entry is gone, ErrNotOwner while the lease holds.
		s.expire(lease, func() bool { return s.Store.Release(s.ctx, k, "probe") == nil })
		s.is(s.Store.Complete(s.ctx, k, "o1", []byte("late"), time.Hour), storage.ErrNotOwner, "Complete after the lease expired")
		s.mustState(s.acquire(k, "o2", "fp", time.Minute), storage.Acquired)
	}},
	{"DoneExpires", func(t *testing.T, s *suite) {
		k := s.key()
		ttl := s.short()
		s.acquire(k, "o1", "fp", time.Minute)
		if err := s.Store.Complete(s.ctx, k, "o1", []byte("r"), ttl); err != nil {
			t.Fatal(err)
		}
		s.mustState(s.acquire(k, "o2", "fp", time.Minute), storage.Done)
		s.expire(ttl, func() bool { return s.acquire(k, "o3", "fp", time.Minute).State == storage.Acquired })
	}},
	{"SubMillisecondRoundsUp", func(t *testing.T, s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", 100*time.Microsecond)
		// Not deleted at once: a zero TTL would have removed the entry.
		if res := s.acquire(k, "o2", "fp", time.Minute); res.State == storage.InFlight && res.LeaseLeft < time.Millisecond {
			t.Fatalf("lease left %v", res.LeaseLeft)
		}
		k2 := s.key()
		s.acquire(k2, "o1", "fp", time.Minute)
		if err := s.Store.Complete(s.ctx, k2, "o1", []byte("r"), 100*time.Microsecond); err != nil {
			t.Fatalf("Complete with a sub-millisecond ttl: %v", err)
		}
	}},
	{"Invalid", func(t *testing.T, s *suite) {
		k := s.key()
		for what, err := range map[string]error{
			"empty key":   func() error { _, err := s.Store.Acquire(s.ctx, "", "o", "", time.Minute); return err }(),
			"empty owner": func() error { _, err := s.Store.Acquire(s.ctx, k, "", "", time.Minute); return err }(),
			"long fingerprint": func() error {
				_, err := s.Store.Acquire(s.ctx, k, "o", strings.Repeat("f", 256), time.Minute)
				return err
			}(),
			"zero lease":     func() error { _, err := s.Store.Acquire(s.ctx, k, "o", "", 0); return err }(),
			"negative lease": func() error { _, err := s.Store.Acquire(s.ctx, k, "o", "", -time.Second); return err }(),
			"zero ttl":       s.Store.Complete(s.ctx, k, "o", nil, 0),
			"zero extend":    s.Store.Extend(s.ctx, k, "o", 0),
		} {
			s.is(err, storage.ErrInvalid, what)
		}
		s.mustState(s.acquire(k, "o", strings.Repeat("f", storage.MaxFingerprintLen), time.Minute), storage.Acquired)
	}},
	{"BinarySafe", func(t *testing.T, s *suite) {
		all := make([]byte, 256)
		for i := range all {
			all[i] = byte(i)
		}
		big := bytes.Repeat([]byte{0, 'P', 'D', 0xff}, 1<<18) // 1 MiB
		for name, rec := range map[string][]byte{"all bytes": all, "NULs": {0, 0, 0}, "empty": {}, "1 MiB": big} {
			k := s.key()
			fp := string(all[:32]) + "\x00"
			s.acquire(k, "o1", fp, time.Minute)
			s.complete(k, "o1", rec)
			res := s.acquire(k, "o2", "", time.Minute)
			if res.State != storage.Done || res.Fingerprint != fp || !bytes.Equal(res.Record, rec) {
				t.Fatalf("%s: record or fingerprint changed in the store", name)
			}
		}
	}},
	{"ConcurrentAcquire", func(t *testing.T, s *suite) {
		const n = 50
		k := s.key()
		var wg sync.WaitGroup
		states := make(chan storage.State, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := s.Store.Acquire(s.ctx, k, "owner-"+strings.Repeat("x", i+1), "fp", time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				states <- res.State
			}()
		}
		wg.Wait()
		close(states)
		acquired := 0
		for st := range states {
			switch st {
			case storage.Acquired:
				acquired++
			case storage.InFlight:
			default:
				t.Fatalf("state %v", st)
			}
		}
		if acquired != 1 {
			t.Fatalf("%d of %d concurrent owners acquired the key", acquired, n)
		}
	}},
}
