// Package storagetest is the contract suite of [storage.Store]. Every store
// of this module passes it, and so must a store written by a user:
//
//	func TestContract(t *testing.T) {
//		storagetest.Run(t, func(t *testing.T) storagetest.Harness {
//			s := mystore.New(...)
//			t.Cleanup(func() { s.Close() })
//			return storagetest.Harness{Store: s, Advance: clock.Advance}
//		})
//	}
//
// It checks every clause of the documentation of [storage.Store]: the three
// outcomes of Acquire, owner checks on Complete, Release and Extend, resends
// (a done entry takes Complete with an identical record as a resend only
// from the owner that completed it, not from one whose lease ran out before
// another owner completed, nor from one that never held it), lease and TTL
// expiry, rounding to milliseconds, invalid arguments, binary
// safety of fingerprints, owners and records, and that exactly one of many
// concurrent acquirers wins.
//
// For a store that implements [storage.Issuer] it checks the clauses of
// issued keys (the Issuer subtests are skipped for the others): Issue
// then AcquireIssued acquires; AcquireIssued of a key never issued
// answers NotIssued and creates nothing; Issue over an entry in any state
// answers ErrExists and changes nothing; an issued entry expires after its
// TTL; AcquireIssued of a taken key answers as Acquire does (in flight,
// done, a resend); Release of an entry taken from an issue makes it
// issued again, for its whole TTL, and Release of an issued entry is a
// resend; Complete and Extend of an issued entry answer ErrNotOwner; an
// entry taken from an issue whose lease runs out is spent (NotIssued);
// Acquire takes an issued entry too; invalid arguments; rounding to
// milliseconds; binary fingerprints and owners; and that exactly one of
// many concurrent AcquireIssued wins.
//
// For a store with committed entries (see Committed entries in the storage
// package documentation), whose Harness has Commit, it checks their
// clauses (the Committed subtests are skipped for the others): a
// committed entry is in flight while its owner's lease runs, and then
// Committed, for every owner, creating nothing; its owner's Release ends
// the lease and keeps the entry; its owner completes it, even after the
// lease; other owners cannot complete, release or extend it; only the
// owner of a processing entry commits it; it expires after the TTL of
// its commit.
//
// For a store that implements [storage.Inspector] it checks its clauses
// (the Inspector subtests are skipped for the others): Lookup of an entry
// in each state (in flight, done with or without its record, issued,
// committed within and after its lease) shows its key, state,
// fingerprint, Since, lease left, expiry and size, and changes nothing;
// Extend does not move an in-flight entry's Since; Lookup of a missing,
// released or expired key answers ErrNotFound; List, page by page with
// several limits, shows every entry of the state it selects and none of
// another, never a record; MinAge leaves out younger entries; invalid
// queries and cursors answer ErrInvalid; Remove of an entry in each state
// answers what it was and frees the key (the removed in-flight entry's
// owner can no longer complete it; an issued key is spent), and Remove of
// a missing key answers ErrNotFound.
//
// For a harness that sets MaxRecord, it checks that a record one byte over
// it is refused with [storage.ErrTooLarge], changing nothing (the owner
// still extends and completes the entry), and that one of MaxRecord bytes
// is kept whole.
//
// For a harness that sets MaxRecord, it checks that a record one byte over
// it is refused with [storage.ErrTooLarge], changing nothing (the owner
// still extends and completes the entry), and that one of MaxRecord bytes
// is kept whole.
//
// It uses the standard testing package only.
package storagetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
)

// Harness is one store under test.
type Harness struct {
	// Store is the store under test. Every subtest uses keys of its own
	// (random, starting with "storagetest:"), so one store may serve every
	// subtest, and a store shared with other tests may be used.
	Store storage.Store

	// Advance moves the store's clock forward by d: an injected clock, or
	// miniredis's FastForward. It must affect this harness's store only.
	//
	// Leave it nil when the clock cannot be moved, as with a real Redis
	// server. The expiry subtests then give entries 50 ms and poll, for at
	// most ten seconds more, until they are gone; they fail if an entry
	// went before its time. A clause whose verdict needs two steps within
	// 50 ms of each other runs again with 200 ms and then 800 ms when the
	// machine was slower than that, and is skipped if it still was.
	Advance func(d time.Duration)

	// Commit makes owner's processing entry under key committed, to be
	// kept for ttl, as the store's fence does in a transaction that then
	// commits (see Committed entries in the storage package
	// documentation); its error wraps storage.ErrNotOwner when owner does
	// not hold the entry. Leave it nil for a store without committed
	// entries: the Committed subtests are skipped.
	Commit func(ctx context.Context, key, owner string, ttl time.Duration) error

	// MaxRecord is the longest record the store keeps, in bytes, as this
	// harness set it up (a store option such as WithMaxRecordBytes, or a
	// server setting). The TooLarge subtests complete an entry with a
	// record one byte longer, which the store must refuse with
	// storage.ErrTooLarge, changing nothing, and then with one of
	// MaxRecord bytes, which it must keep. Leave it 0 to skip them. At
	// least 1 MiB: the Binary subtests keep a record of 1 MiB.
	MaxRecord int
}

// Run runs the contract suite, one subtest per clause. newHarness is called
// once per subtest. The subtests run one after another.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			for _, c := range g.cases {
				t.Run(c.name, func(t *testing.T) {
					c.run(&suite{Harness: newHarness(t), t: t, ctx: t.Context()})
				})
			}
		})
	}
}

type testCase struct {
	name string
	run  func(s *suite)
}

var groups = []struct {
	name  string
	cases []testCase
}{
	{"Acquire", acquireCases},
	{"Complete", completeCases},
	{"Release", releaseCases},
	{"Extend", extendCases},
	{"Expiry", expiryCases},
	{"Milliseconds", millisecondCases},
	{"Invalid", invalidCases},
	{"Binary", binaryCases},
	{"Concurrent", concurrentCases},
	{"Issuer", issuerCases},
	{"Committed", committedCases},
	{"Inspector", inspectorCases},
	{"TooLarge", tooLargeCases},
}

// tooLargeCases: a record over the store's limit is a permanent refusal
// that changes nothing (ErrTooLarge), not an outage and not a lost lease;
// the middleware relies on it to keep the key done, not replayable.
var tooLargeCases = []testCase{
	{"RefusedChangesNothing", func(s *suite) {
		max := s.maxRecord()
		k := s.key()
		s.acquire(k, "o1", "fp", minute)
		err := s.Store.Complete(s.ctx, k, "o1", bytes.Repeat([]byte{0, 'x', 0xff}, max/3+1)[:max+1], hour)
		s.is(err, storage.ErrTooLarge, fmt.Sprintf("Complete of %d bytes over a limit of %d", max+1, max))
		if errors.Is(err, storage.ErrNotOwner) || errors.Is(err, storage.ErrInvalid) {
			s.t.Fatalf("Complete of %d bytes: %v, want ErrTooLarge alone", max+1, err)
		}
		s.wantInFlight(k, "fp")
		// The owner still holds the entry: it extends it and completes it
		// with a record that fits.
		if err := s.Store.Extend(s.ctx, k, "o1", minute); err != nil {
			s.t.Fatalf("Extend after the refused Complete: %v", err)
		}
		s.complete(k, "o1", []byte("not replayable"), hour)
		s.wantDone(k, "fp", []byte("not replayable"))
	}},
	{"AtTheLimitKept", func(s *suite) {
		max := s.maxRecord()
		k := s.key()
		rec := bytes.Repeat([]byte{0xff, 0, 'y'}, max/3+1)[:max]
		s.acquire(k, "o1", "fp", minute)
		s.complete(k, "o1", rec, hour)
		res := s.acquire(k, "o2", "fp", minute)
		if res.State != storage.Done || !bytes.Equal(res.Record, rec) {
			s.t.Fatalf("entry is %v with %d bytes, want done with the %d bytes completed", res.State, len(res.Record), len(rec))
		}
	}},
}

// maxRecord returns the harness's MaxRecord, skipping the test when it
// has none.
func (s *suite) maxRecord() int {
	if s.MaxRecord <= 0 {
		s.t.Skip("the harness sets no MaxRecord")
	}
	return s.MaxRecord
}

const (
	minute = time.Minute
	hour   = time.Hour
)

var acquireCases = []testCase{
	{"New", func(s *suite) {
		s.wantAcquired(s.acquire(s.key(), "o1", "fp", minute))
	}},
	{"SameOwnerRenewsLease", func(s *suite) {
		k := s.key()
		s.wantState(s.acquire(k, "o1", "fp", minute), storage.Acquired)
		s.wantAcquired(s.acquire(k, "o1", "fp", hour))
		res := s.wantInFlight(k, "fp")
		if res.LeaseLeft <= minute {
			s.t.Fatalf("lease left %v: acquiring again did not renew the lease to an hour", res.LeaseLeft)
		}
	}},
	{"OtherOwnerInFlight", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp-1", minute)
		res := s.acquire(k, "o2", "fp-2", minute)
		s.wantState(res, storage.InFlight)
		if res.Fingerprint != "fp-1" {
			s.t.Fatalf("in flight: fingerprint %q, want the holder's %q", res.Fingerprint, "fp-1")
		}
		if res.LeaseLeft < time.Millisecond || res.LeaseLeft > minute {
			s.t.Fatalf("in flight: lease left %v, want between 1ms and the lease of %v", res.LeaseLeft, minute)
		}
		if res.Record != nil {
			s.t.Fatalf("in flight: record %q, want nil", res.Record)
		}
		// The losing acquire changed nothing: o1 still holds the entry.
		s.wantInFlight(k, "fp-1")
		s.complete(k, "o1", []byte("r"), hour)
	}},
	{"Done", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", minute)
		s.complete(k, "o1", []byte("record"), hour)
		for _, owner := range []string{"o1", "o2"} {
			res := s.acquire(k, owner, "another fingerprint", minute)
			s.wantState(res, storage.Done)
			if res.Fingerprint != "fp" || string(res.Record) != "record" || res.LeaseLeft != 0 {
				s.t.Fatalf("Acquire of a done entry by %s: %+v, want fingerprint %q and record %q", owner, res, "fp", "record")
			}
		}
	}},
}

var completeCases = []testCase{
	{"ByOwner", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", minute)
		s.complete(k, "o1", []byte("record"), hour)
		s.wantDone(k, "fp", []byte("record"))
	}},
	{"ByOtherOwner", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", minute)
		s.is(s.Store.Complete(s.ctx, k, "o2", []byte("x"), hour), storage.ErrNotOwner, "Complete by another owner")
		s.wantInFlight(k, "fp")
		s.complete(k, "o1", []byte("record"), hour)
		s.wantDone(k, "fp", []byte("record"))
	}},
	{"Missing", func(s *suite) {
		k := s.key()
		s.is(s.Store.Complete(s.ctx, k, "o1", []byte("x"), hour), storage.ErrNotOwner, "Complete of a missing key")
		s.wantState(s.acquire(k, "o2", "fp", minute), storage.Acquired)
	}},
	{"ResendSameRecord", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", minute)
		s.complete(k, "o1", []byte("record"), hour)
		if err := s.Store.Complete(s.ctx, k, "o1", []byte("record"), hour); err != nil {
			s.t.Fatalf("Complete resent with the same record: %v, want nil", err)
		}
		s.wantDone(k, "fp", []byte("record"))
	}},
	{"OtherRecordAfterDone", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", minute)
		s.complete(k, "o1", []byte("record"), hour)
		s.is(s.Store.Complete(s.ctx, k, "o1", []byte("other"), hour), storage.ErrNotOwner, "Complete with another record after done")
		s.is(s.Store.Complete(s.ctx, k, "o2", []byte("record!"), hour), storage.ErrNotOwner, "Complete by another owner after done")
		s.is(s.Store.Complete(s.ctx, k, "o1", nil, hour), storage.ErrNotOwner, "Complete with an empty record after done")
		s.wantDone(k, "fp", []byte("record"))
	}},
	{"DoesNotRetainCallerBuffer", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", minute)
		buf := []byte("record")
		s.complete(k, "o1", buf, hour)
		copy(buf, "XXXXXX")
		s.wantDone(k, "fp", []byte("record"))
	}},
	{"LeaseLostSameRecord", func(s *suite) { s.leaseLostSameRecord() }},
	{"OtherOwnerSameRecordAfterDone", func(s *suite) { s.otherOwnerSameRecordAfterDone() }},
}

// leaseLostSameRecord: owner A's lease runs out, owner B acquires and
// completes with record R; A's Complete with the very same R must not be
// taken for a resend (that would report two executions as one), while B's
// resend still is one.
func (s *suite) leaseLostSameRecord() {
	name, complete := "Complete", s.Store.Complete
	k := s.key()
	lease := s.short()
	start := time.Now()
	s.wantAcquired(s.acquire(k, "owner-A", "fp-A", lease))
	// B's acquire finds A in flight, changing nothing, until A's lease
	// has run out; then it takes the key.
	s.expire(start, lease, func() bool {
		s.t.Helper()
		return s.acquire(k, "owner-B", "fp-B", minute).State == storage.Acquired
	})
	if err := complete(s.ctx, k, "owner-B", []byte("record"), hour); err != nil {
		s.t.Fatalf("%s by owner-B, who took the key after owner-A's lease ran out: %v", name, err)
	}
	bufA := []byte("record")
	s.is(complete(s.ctx, k, "owner-A", bufA, hour), storage.ErrNotOwner,
		name+" by owner-A, whose lease ran out, with the record owner-B completed with")
	copy(bufA, "XXXXXX") // still owner-A's
	s.wantDone(k, "fp-B", []byte("record"))
	if err := complete(s.ctx, k, "owner-B", []byte("record"), hour); err != nil {
		s.t.Fatalf("%s resent by owner-B with the same record: %v, want nil", name, err)
	}
	s.is(complete(s.ctx, k, "owner-A", []byte("record"), hour), storage.ErrNotOwner,
		name+" by owner-A, after owner-B's resend")
	s.wantDone(k, "fp-B", []byte("record"))
}

// otherOwnerSameRecordAfterDone: once A has completed with R, a Complete
// with R by B, who never held the entry, is no resend.
func (s *suite) otherOwnerSameRecordAfterDone() {
	name, complete := "Complete", s.Store.Complete
	k := s.key()
	s.wantAcquired(s.acquire(k, "owner-A", "fp-A", minute))
	if err := complete(s.ctx, k, "owner-A", []byte("record"), hour); err != nil {
		s.t.Fatalf("%s by owner-A: %v", name, err)
	}
	bufB := []byte("record")
	s.is(complete(s.ctx, k, "owner-B", bufB, hour), storage.ErrNotOwner,
		name+" by owner-B, who never held the entry, with owner-A's record")
	copy(bufB, "XXXXXX") // still owner-B's
	s.wantDone(k, "fp-A", []byte("record"))
	if err := complete(s.ctx, k, "owner-A", []byte("record"), hour); err != nil {
		s.t.Fatalf("%s resent by owner-A with the same record: %v, want nil", name, err)
	}
	s.wantDone(k, "fp-A", []byte("record"))
}

var releaseCases = []testCase{
	{"ByOwnerThenReacquire", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp-1", minute)
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			s.t.Fatalf("Release by the owner: %v", err)
		}
		s.wantState(s.acquire(k, "o2", "fp-2", minute), storage.Acquired)
		s.wantInFlight(k, "fp-2")
		s.is(s.Store.Complete(s.ctx, k, "o1", []byte("r"), hour), storage.ErrNotOwner, "Complete by the owner that released")
	}},
	{"MissingAndResend", func(s *suite) {
		if err := s.Store.Release(s.ctx, s.key(), "o1"); err != nil {
			s.t.Fatalf("Release of a missing key: %v, want nil", err)
		}
		k := s.key()
		s.acquire(k, "o1", "fp", minute)
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			s.t.Fatalf("Release: %v", err)
		}
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			s.t.Fatalf("Release resent: %v, want nil", err)
		}
	}},
	{"ByOtherOwner", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", minute)
		s.is(s.Store.Release(s.ctx, k, "o2"), storage.ErrNotOwner, "Release by another owner")
		s.wantInFlight(k, "fp")
		s.complete(k, "o1", []byte("r"), hour)
	}},
	{"Done", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", minute)
		s.complete(k, "o1", []byte("record"), hour)
		s.is(s.Store.Release(s.ctx, k, "o1"), storage.ErrNotOwner, "Release of a done entry by its owner")
		s.is(s.Store.Release(s.ctx, k, "o2"), storage.ErrNotOwner, "Release of a done entry by another owner")
		s.wantDone(k, "fp", []byte("record"))
	}},
}

var extendCases = []testCase{
	{"ByOwnerOutlivesLease", func(s *suite) {
		s.inTime(func(lease time.Duration) bool {
			k, control := s.key(), s.key()
			start := time.Now()
			s.acquire(k, "o1", "fp", lease)
			s.acquire(control, "o1", "fp", lease)
			if err := s.Store.Extend(s.ctx, k, "o1", hour); err != nil {
				if s.late(start, lease) {
					return false
				}
				s.t.Fatalf("Extend by the owner: %v", err)
			}
			if err := s.Store.Extend(s.ctx, k, "o1", hour); err != nil {
				s.t.Fatalf("Extend resent: %v", err)
			}
			// The control entry, acquired after k with the same lease, expires:
			// k's original lease has run out too.
			s.expire(start, lease, s.gone(control))
			res := s.wantInFlight(k, "fp")
			if res.LeaseLeft <= lease {
				s.t.Fatalf("lease left %v after Extend to an hour", res.LeaseLeft)
			}
			s.complete(k, "o1", []byte("r"), hour)
			return true
		})
	}},
	{"NotOwner", func(s *suite) {
		k := s.key()
		s.is(s.Store.Extend(s.ctx, k, "o1", minute), storage.ErrNotOwner, "Extend of a missing key")
		s.wantState(s.acquire(k, "o1", "fp", minute), storage.Acquired) // and it did not create one
		s.is(s.Store.Extend(s.ctx, k, "o2", hour), storage.ErrNotOwner, "Extend by another owner")
		if res := s.wantInFlight(k, "fp"); res.LeaseLeft > minute {
			s.t.Fatalf("lease left %v: Extend by another owner renewed the lease", res.LeaseLeft)
		}
		s.complete(k, "o1", []byte("record"), hour)
		s.is(s.Store.Extend(s.ctx, k, "o1", minute), storage.ErrNotOwner, "Extend of a done entry")
		s.wantDone(k, "fp", []byte("record"))
	}},
}

var expiryCases = []testCase{
	{"LeaseFreesKey", func(s *suite) {
		k := s.key()
		lease := s.short()
		start := time.Now()
		s.acquire(k, "o1", "fp-1", lease)
		s.expire(start, lease, s.gone(k)) // the probe that finds it gone acquires it
		s.wantInFlight(k, "fp-probe")
		s.is(s.Store.Complete(s.ctx, k, "o1", []byte("late"), hour), storage.ErrNotOwner, "Complete after the lease ran out")
		s.is(s.Store.Extend(s.ctx, k, "o1", minute), storage.ErrNotOwner, "Extend after the lease ran out")
		s.is(s.Store.Release(s.ctx, k, "o1"), storage.ErrNotOwner, "Release after the lease ran out and another owner took it")
		s.wantInFlight(k, "fp-probe")
	}},
	{"LeaseRanOutNothingHeld", func(s *suite) {
		k := s.key()
		lease := s.short()
		start := time.Now()
		s.acquire(k, "o1", "fp", lease)
		// Release by a stranger answers ErrNotOwner while the lease holds and
		// nil once the entry is gone, changing nothing either way.
		s.expire(start, lease, func() bool { return s.Store.Release(s.ctx, k, "stranger") == nil })
		s.is(s.Store.Complete(s.ctx, k, "o1", []byte("late"), hour), storage.ErrNotOwner, "Complete after the lease ran out")
		s.is(s.Store.Extend(s.ctx, k, "o1", minute), storage.ErrNotOwner, "Extend after the lease ran out")
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			s.t.Fatalf("Release after the lease ran out: %v, want nil", err)
		}
		s.wantState(s.acquire(k, "o2", "fp", minute), storage.Acquired)
	}},
	{"DoneAfterTTL", func(s *suite) {
		s.inTime(func(ttl time.Duration) bool {
			k := s.key()
			s.acquire(k, "o1", "fp", hour)
			start := time.Now()
			s.complete(k, "o1", []byte("r"), ttl)
			if res := s.acquire(k, "storagetest-observer", "observer's fingerprint", minute); res.State != storage.Done && s.late(start, ttl) {
				return false
			}
			s.wantDone(k, "fp", []byte("r"))
			s.expire(start, ttl, s.gone(k))
			return true
		})
	}},
}

var millisecondCases = []testCase{
	// A store that truncated a sub-millisecond duration to zero would
	// delete the entry at once (Redis's PEXPIRE 0) or refuse it (SET PX 0).
	{"SubMillisecondLease", func(s *suite) {
		s.eventually("a 100µs lease is gone at once", func(k string) bool {
			s.acquire(k, "o1", "fp", 100*time.Microsecond)
			return s.acquire(k, "o2", "fp", minute).State == storage.InFlight
		})
	}},
	{"SubMillisecondExtend", func(s *suite) {
		s.eventually("an Extend of 100µs deleted the entry at once", func(k string) bool {
			s.acquire(k, "o1", "fp", minute)
			if err := s.Store.Extend(s.ctx, k, "o1", 100*time.Microsecond); err != nil {
				s.t.Fatalf("Extend by 100µs: %v", err)
			}
			return s.acquire(k, "o2", "fp", minute).State == storage.InFlight
		})
	}},
	{"SubMillisecondTTL", func(s *suite) {
		s.eventually("a 100µs TTL is gone at once", func(k string) bool {
			s.acquire(k, "o1", "fp", minute)
			s.complete(k, "o1", []byte("r"), 100*time.Microsecond)
			return s.acquire(k, "o2", "fp", minute).State == storage.Done
		})
	}},
	{"RoundsUp", func(s *suite) {
		// 1.5ms is kept as 2ms, not 1ms. On a real clock the lease left
		// may read 1ms if a millisecond ticked between the two calls, but
		// not every time.
		var k string
		s.eventually("a lease of 1.5ms never had 2ms left", func(key string) bool {
			k = key
			s.acquire(k, "o1", "fp", 1500*time.Microsecond)
			res := s.acquire(k, "o2", "fp", minute)
			return res.State == storage.InFlight && res.LeaseLeft == 2*time.Millisecond
		})
		if s.Advance == nil {
			return
		}
		s.Advance(time.Millisecond)
		if res := s.wantInFlight(k, "fp"); res.LeaseLeft != time.Millisecond {
			s.t.Fatalf("a lease of 1.5ms, 1ms later: %v left, want 1ms", res.LeaseLeft)
		}
		s.Advance(time.Millisecond)
		if !s.gone(k)() {
			s.t.Fatal("a lease of 1.5ms still held 2ms later")
		}
	}},
}

var invalidCases = []testCase{
	{"Acquire", func(s *suite) {
		for _, c := range []struct {
			what            string
			key, owner, fp  string
			lease           time.Duration
			checkNotCreated bool
		}{
			{"empty key", "", "o", "fp", minute, false},
			{"empty owner", s.key(), "", "fp", minute, true},
			{"fingerprint of MaxFingerprintLen+1 bytes", s.key(), "o", strings.Repeat("f", storage.MaxFingerprintLen+1), minute, true},
			{"zero lease", s.key(), "o", "fp", 0, true},
			{"negative lease", s.key(), "o", "fp", -time.Second, true},
		} {
			res, err := s.Store.Acquire(s.ctx, c.key, c.owner, c.fp, c.lease)
			s.is(err, storage.ErrInvalid, "Acquire with "+c.what)
			if res.State != 0 {
				s.t.Errorf("Acquire with %s: state %v alongside the error", c.what, res.State)
			}
			if c.checkNotCreated {
				s.wantState(s.acquire(c.key, "probe", "fp", minute), storage.Acquired)
			}
		}
	}},
	{"LongestFingerprint", func(s *suite) {
		k := s.key()
		fp := strings.Repeat("\xff", storage.MaxFingerprintLen)
		s.wantState(s.acquire(k, "o1", fp, minute), storage.Acquired)
		s.wantInFlight(k, fp)
		s.complete(k, "o1", []byte("r"), hour)
		s.wantDone(k, fp, []byte("r"))
	}},
	{"EmptyOwner", func(s *suite) {
		// The contract asks Acquire alone to refuse an empty owner; the
		// other methods must not take it for the owner of anything.
		notHeld := func(err error, what string) {
			s.t.Helper()
			if !errors.Is(err, storage.ErrNotOwner) && !errors.Is(err, storage.ErrInvalid) {
				s.t.Fatalf("%s with an empty owner: %v, want ErrNotOwner or ErrInvalid", what, err)
			}
		}
		k := s.key()
		s.acquire(k, "o1", "fp", minute)
		notHeld(s.Store.Extend(s.ctx, k, "", hour), "Extend of an entry in flight")
		notHeld(s.Store.Release(s.ctx, k, ""), "Release of an entry in flight")
		notHeld(s.Store.Complete(s.ctx, k, "", []byte("x"), hour), "Complete of an entry in flight")
		s.wantInFlight(k, "fp")
		s.complete(k, "o1", []byte("r"), hour)
		notHeld(s.Store.Extend(s.ctx, k, "", hour), "Extend of a done entry")
		notHeld(s.Store.Release(s.ctx, k, ""), "Release of a done entry")
		notHeld(s.Store.Complete(s.ctx, k, "", []byte("x"), hour), "Complete of a done entry")
		s.wantDone(k, "fp", []byte("r"))
	}},
	{"CompleteTTL", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", minute)
		s.is(s.Store.Complete(s.ctx, k, "o1", []byte("r"), 0), storage.ErrInvalid, "Complete with a zero ttl")
		s.is(s.Store.Complete(s.ctx, k, "o1", []byte("r"), -time.Second), storage.ErrInvalid, "Complete with a negative ttl")
		s.wantInFlight(k, "fp")
		s.complete(k, "o1", []byte("r"), hour)
	}},
	{"ExtendLease", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", minute)
		s.is(s.Store.Extend(s.ctx, k, "o1", 0), storage.ErrInvalid, "Extend by zero")
		s.is(s.Store.Extend(s.ctx, k, "o1", -time.Second), storage.ErrInvalid, "Extend by a negative lease")
		s.wantInFlight(k, "fp")
		s.complete(k, "o1", []byte("r"), hour)
	}},
}

var binaryCases = []testCase{
	{"Records", func(s *suite) {
		all := make([]byte, 256)
		for i := range all {
			all[i] = byte(i)
		}
		for _, c := range []struct {
			name string
			rec  []byte
		}{
			{"every byte value", all},
			{"NUL bytes", []byte{0, 0, 'x', 0}},
			{"looks like an entry", []byte("P\x02fpowner")},
			{"CRLF", []byte("\r\n$-1\r\n")},
			{"empty", []byte{}},
			{"nil", nil},
			{"1 MiB", bytes.Repeat([]byte{0, 'P', 'D', 0xff}, 1<<18)},
		} {
			k := s.key()
			s.acquire(k, "o1", "fp", minute)
			s.complete(k, "o1", c.rec, hour)
			res := s.acquire(k, "o2", "", minute)
			if res.State != storage.Done || !bytes.Equal(res.Record, c.rec) {
				s.t.Errorf("record %s: came back as state %v, %d bytes, want %d bytes as given", c.name, res.State, len(res.Record), len(c.rec))
			}
			if err := s.Store.Complete(s.ctx, k, "o1", c.rec, hour); err != nil {
				s.t.Errorf("record %s: resent Complete: %v", c.name, err)
			}
		}
	}},
	{"Fingerprints", func(s *suite) {
		for _, n := range []int{0, 1, 2, 127, 128, 129, 254, storage.MaxFingerprintLen} {
			fp := make([]byte, n)
			for i := range fp {
				fp[i] = byte(255 - i) // high bytes, and NUL at 255
			}
			k := s.key()
			s.acquire(k, "o1", string(fp), minute)
			if res := s.acquire(k, "o2", "", minute); res.Fingerprint != string(fp) {
				s.t.Errorf("fingerprint of %d bytes came back in flight as %q", n, res.Fingerprint)
			}
			s.complete(k, "o1", []byte("r"), hour)
			if res := s.acquire(k, "o2", "", minute); res.Fingerprint != string(fp) {
				s.t.Errorf("fingerprint of %d bytes came back done as %q", n, res.Fingerprint)
			}
		}
	}},
	{"Owners", func(s *suite) {
		// Owners that are prefixes of each other, or differ only past a
		// NUL byte, are different owners.
		for _, pair := range [][2]string{{"o", "o\x00"}, {"ab", "abc"}, {"abc", "ab"}, {"\x00\xff", "\x00\xfe"}, {"o\x00x", "o\x00y"}} {
			holder, other := pair[0], pair[1]
			k := s.key()
			s.wantState(s.acquire(k, holder, "fp", minute), storage.Acquired)
			s.wantState(s.acquire(k, holder, "fp", minute), storage.Acquired)
			s.wantState(s.acquire(k, other, "fp", minute), storage.InFlight)
			s.is(s.Store.Extend(s.ctx, k, other, minute), storage.ErrNotOwner, fmt.Sprintf("Extend by %q of %q's entry", other, holder))
			s.is(s.Store.Release(s.ctx, k, other), storage.ErrNotOwner, fmt.Sprintf("Release by %q of %q's entry", other, holder))
			s.is(s.Store.Complete(s.ctx, k, other, []byte("r"), hour), storage.ErrNotOwner, fmt.Sprintf("Complete by %q of %q's entry", other, holder))
			if err := s.Store.Extend(s.ctx, k, holder, minute); err != nil {
				s.t.Fatalf("Extend by %q: %v", holder, err)
			}
			s.complete(k, holder, []byte("r"), hour)
		}
	}},
}

var concurrentCases = []testCase{
	{"AcquireOneWinner", func(s *suite) {
		k := s.key()
		s.oneWinner(k, "Acquire", s.Store.Acquire)
	}},
}

// issuerCases check a storage.Issuer: issued keys.
var issuerCases = []testCase{
	{"IssueThenAcquire", func(s *suite) {
		k := s.key()
		s.issue(k, hour)
		s.wantAcquired(s.acquireIssued(k, "o1", "fp", minute))
		s.wantInFlight(k, "fp")
		s.complete(k, "o1", []byte("record"), hour)
		s.wantDone(k, "fp", []byte("record"))
	}},
	{"NeverIssued", func(s *suite) {
		k := s.key()
		for range 2 {
			if res := s.acquireIssued(k, "o1", "fp", minute); res.State != storage.NotIssued || res.Fingerprint != "" || res.LeaseLeft != 0 || res.Record != nil {
				s.t.Fatalf("AcquireIssued of a key never issued: %+v, want State NotIssued and every other field empty", res)
			}
		}
		// Nothing was created: the key is free for an Issue.
		s.issue(k, hour)
		s.wantAcquired(s.acquireIssued(k, "o1", "fp", minute))
	}},
	{"IssueTwice", func(s *suite) {
		k := s.key()
		s.issue(k, hour)
		s.is(s.issuer().Issue(s.ctx, k, hour), storage.ErrExists, "Issue of an issued key")
		s.wantAcquired(s.acquireIssued(k, "o1", "fp", minute))
	}},
	{"IssueOverEntries", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", minute)
		s.is(s.issuer().Issue(s.ctx, k, hour), storage.ErrExists, "Issue over an entry in flight")
		s.wantInFlight(k, "fp")
		// Changed nothing: still the owner's, not issued.
		if err := s.Store.Extend(s.ctx, k, "o1", minute); err != nil {
			s.t.Fatalf("Extend by the owner after the refused Issue: %v", err)
		}
		s.complete(k, "o1", []byte("record"), hour)
		s.is(s.issuer().Issue(s.ctx, k, hour), storage.ErrExists, "Issue over a done entry")
		s.wantDone(k, "fp", []byte("record"))

		k = s.key()
		s.issue(k, hour)
		s.acquireIssued(k, "o1", "fp", minute)
		s.is(s.issuer().Issue(s.ctx, k, hour), storage.ErrExists, "Issue over an entry in flight taken from an issue")
		s.wantInFlight(k, "fp")
		s.complete(k, "o1", []byte("record"), hour)
		s.is(s.issuer().Issue(s.ctx, k, hour), storage.ErrExists, "Issue over a done entry taken from an issue")
		s.wantDone(k, "fp", []byte("record"))
	}},
	{"IssuedExpires", func(s *suite) {
		k, control := s.key(), s.key()
		ttl := s.short()
		// The control key, issued first, is gone once k is.
		s.issue(control, ttl)
		start := time.Now()
		s.issue(k, ttl)
		s.expire(start, ttl, s.issuable(k))
		if res := s.acquireIssued(control, "o1", "fp", minute); res.State != storage.NotIssued {
			s.t.Fatalf("AcquireIssued after the issue's TTL ran out: %v, want NotIssued", res.State)
		}
	}},
	{"InFlight", func(s *suite) {
		k := s.key()
		s.issue(k, hour)
		s.wantAcquired(s.acquireIssued(k, "o1", "fp-1", minute))
		res := s.acquireIssued(k, "o2", "fp-2", minute)
		s.wantState(res, storage.InFlight)
		if res.Fingerprint != "fp-1" || res.LeaseLeft < time.Millisecond || res.LeaseLeft > minute || res.Record != nil {
			s.t.Fatalf("AcquireIssued by a second owner: %+v, want in flight with %q and a lease left within %v", res, "fp-1", minute)
		}
		// A resend by the holder renews its lease.
		s.wantAcquired(s.acquireIssued(k, "o1", "fp-1", hour))
		if res := s.acquireIssued(k, "o2", "fp-2", minute); res.State != storage.InFlight || res.LeaseLeft <= minute {
			s.t.Fatalf("after the holder's resend with an hour: %v with %v left, want in flight with more than %v", res.State, res.LeaseLeft, minute)
		}
		s.complete(k, "o1", []byte("r"), hour)
	}},
	{"Done", func(s *suite) {
		k := s.key()
		s.issue(k, hour)
		s.acquireIssued(k, "o1", "fp", minute)
		s.complete(k, "o1", []byte("record"), hour)
		for _, owner := range []string{"o1", "o2"} {
			res := s.acquireIssued(k, owner, "another fingerprint", minute)
			if res.State != storage.Done || res.Fingerprint != "fp" || string(res.Record) != "record" || res.LeaseLeft != 0 {
				s.t.Fatalf("AcquireIssued of a done entry by %s: %+v, want done with %q and %q", owner, res, "fp", "record")
			}
		}
		s.wantDone(k, "fp", []byte("record"))
		if err := s.Store.Complete(s.ctx, k, "o1", []byte("record"), hour); err != nil {
			s.t.Fatalf("Complete resent: %v", err)
		}
		s.is(s.Store.Release(s.ctx, k, "o1"), storage.ErrNotOwner, "Release of a done entry taken from an issue")
		s.wantDone(k, "fp", []byte("record"))
	}},
	{"ReleaseIssuesAgain", func(s *suite) {
		s.inTime(func(d time.Duration) bool {
			k := s.key()
			ttl := 4 * d
			issued := time.Now()
			s.issue(k, ttl)
			s.pass(ttl / 2)
			if res := s.acquireIssued(k, "o1", "fp-1", minute); res.State != storage.Acquired {
				if s.late(issued, ttl) {
					return false
				}
				s.wantAcquired(res)
			}
			released := time.Now()
			if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
				s.t.Fatalf("Release of an entry taken from an issue: %v", err)
			}
			if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
				s.t.Fatalf("Release resent (the entry is issued again): %v, want nil", err)
			}
			s.is(s.Store.Complete(s.ctx, k, "o1", []byte("r"), hour), storage.ErrNotOwner, "Complete by the owner that released")
			s.is(s.Store.Extend(s.ctx, k, "o1", minute), storage.ErrNotOwner, "Extend by the owner that released")
			if err := s.issuer().Issue(s.ctx, k, hour); !errors.Is(err, storage.ErrExists) {
				if s.late(released, ttl) {
					return false
				}
				s.is(err, storage.ErrExists, "Issue of a key issued again")
			}
			if res := s.acquireIssued(k, "o2", "fp-2", minute); res.State != storage.Acquired {
				if s.late(released, ttl) {
					return false
				}
				s.wantAcquired(res)
			}
			s.wantInFlight(k, "fp-2")
			// Released again, it lasts for the issue's whole TTL from now.
			start := time.Now()
			if err := s.Store.Release(s.ctx, k, "o2"); err != nil {
				s.t.Fatalf("Release: %v", err)
			}
			s.expire(start, ttl, s.issuable(k))
			return true
		})
	}},
	{"IssuedHasNoOwner", func(s *suite) {
		k := s.key()
		s.issue(k, hour)
		for _, owner := range []string{"o1", ""} {
			notHeld := func(err error, what string) {
				s.t.Helper()
				if !errors.Is(err, storage.ErrNotOwner) && !(owner == "" && errors.Is(err, storage.ErrInvalid)) {
					s.t.Fatalf("%s of an issued entry by %q: %v, want ErrNotOwner", what, owner, err)
				}
			}
			notHeld(s.Store.Extend(s.ctx, k, owner, minute), "Extend")
			notHeld(s.Store.Complete(s.ctx, k, owner, []byte("r"), hour), "Complete")
			if err := s.Store.Release(s.ctx, k, owner); err != nil {
				s.t.Fatalf("Release of an issued entry by %q: %v, want nil (a resend)", owner, err)
			}
		}
		// Still issued, and nothing else.
		s.is(s.issuer().Issue(s.ctx, k, hour), storage.ErrExists, "Issue of an issued key")
		s.wantAcquired(s.acquireIssued(k, "o1", "fp", minute))
	}},
	{"LeaseRunsOutSpent", func(s *suite) {
		k := s.key()
		s.issue(k, hour)
		lease := s.short()
		start := time.Now()
		s.wantAcquired(s.acquireIssued(k, "o1", "fp", lease))
		// The probe finds the entry in flight, which changes nothing, and
		// then NotIssued, which creates nothing.
		s.expire(start, lease, func() bool {
			s.t.Helper()
			return s.acquireIssued(k, "storagetest-probe", "fp-probe", minute).State == storage.NotIssued
		})
		s.is(s.Store.Complete(s.ctx, k, "o1", []byte("late"), hour), storage.ErrNotOwner, "Complete after the lease ran out")
		s.is(s.Store.Extend(s.ctx, k, "o1", minute), storage.ErrNotOwner, "Extend after the lease ran out")
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			s.t.Fatalf("Release after the lease ran out: %v, want nil", err)
		}
		if res := s.acquireIssued(k, "o2", "fp", minute); res.State != storage.NotIssued {
			s.t.Fatalf("AcquireIssued after the lease ran out and a Release: %v, want NotIssued (the key is spent)", res.State)
		}
	}},
	{"AcquireTakesIssued", func(s *suite) {
		k := s.key()
		s.issue(k, hour)
		s.wantAcquired(s.acquire(k, "o1", "fp-1", minute))
		s.wantInFlight(k, "fp-1")
		if res := s.acquireIssued(k, "o2", "fp-2", minute); res.State != storage.InFlight || res.Fingerprint != "fp-1" {
			s.t.Fatalf("AcquireIssued of an issued entry that Acquire took: %v with %q, want in flight with %q", res.State, res.Fingerprint, "fp-1")
		}
		// It remembers the issue: released, it is issued again.
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			s.t.Fatalf("Release: %v", err)
		}
		s.is(s.issuer().Issue(s.ctx, k, hour), storage.ErrExists, "Issue of a key released back to issued")
		s.wantAcquired(s.acquireIssued(k, "o2", "fp-2", minute))
		s.complete(k, "o2", []byte("r"), hour)

		// An entry that Acquire created is not issued: released, it is gone.
		k = s.key()
		s.acquire(k, "o1", "fp", minute)
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			s.t.Fatalf("Release: %v", err)
		}
		if res := s.acquireIssued(k, "o2", "fp", minute); res.State != storage.NotIssued {
			s.t.Fatalf("AcquireIssued after Release of an entry that was never issued: %v, want NotIssued", res.State)
		}
	}},
	{"Invalid", func(s *suite) {
		for _, c := range []struct {
			what string
			key  string
			ttl  time.Duration
		}{
			{"empty key", "", hour},
			{"zero ttl", s.key(), 0},
			{"negative ttl", s.key(), -time.Second},
		} {
			s.is(s.issuer().Issue(s.ctx, c.key, c.ttl), storage.ErrInvalid, "Issue with "+c.what)
			if c.key != "" {
				if res := s.acquireIssued(c.key, "o", "fp", minute); res.State != storage.NotIssued {
					s.t.Fatalf("Issue with %s: the key is %v, want nothing issued", c.what, res.State)
				}
			}
		}
		k := s.key()
		s.issue(k, hour)
		for _, c := range []struct {
			what           string
			key, owner, fp string
			lease          time.Duration
		}{
			{"empty key", "", "o", "fp", minute},
			{"empty owner", k, "", "fp", minute},
			{"fingerprint of MaxFingerprintLen+1 bytes", k, "o", strings.Repeat("f", storage.MaxFingerprintLen+1), minute},
			{"zero lease", k, "o", "fp", 0},
			{"negative lease", k, "o", "fp", -time.Second},
		} {
			res, err := s.issuer().AcquireIssued(s.ctx, c.key, c.owner, c.fp, c.lease)
			s.is(err, storage.ErrInvalid, "AcquireIssued with "+c.what)
			if res.State != 0 {
				s.t.Errorf("AcquireIssued with %s: state %v alongside the error", c.what, res.State)
			}
		}
		// None of them took the issued entry.
		s.wantAcquired(s.acquireIssued(k, "o", "fp", minute))
	}},
	{"Milliseconds", func(s *suite) {
		s.eventually("an issue of 100µs is gone at once", func(k string) bool {
			s.issue(k, 100*time.Microsecond)
			return errors.Is(s.issuer().Issue(s.ctx, k, minute), storage.ErrExists)
		})
		s.eventually("a lease of 100µs on an issued entry is gone at once", func(k string) bool {
			s.issue(k, hour)
			s.acquireIssued(k, "o1", "fp", 100*time.Microsecond)
			return s.acquireIssued(k, "o2", "fp", minute).State == storage.InFlight
		})
	}},
	{"Binary", func(s *suite) {
		for _, c := range []struct{ holder, other, fp string }{
			{"o", "o\x00", ""},
			{"ab", "abc", "\x00"},
			{"abc", "ab", "1"},
			{"1", "12", "12"},
			{"\x00\xff", "\x00\xfe", strings.Repeat("\xff", storage.MaxFingerprintLen)},
			{"o\x00x", "o\x00y", "I5"},
		} {
			k := s.key()
			s.issue(k, hour)
			s.wantAcquired(s.acquireIssued(k, c.holder, c.fp, minute))
			s.wantAcquired(s.acquireIssued(k, c.holder, c.fp, minute))
			if res := s.acquireIssued(k, c.other, "x", minute); res.State != storage.InFlight || res.Fingerprint != c.fp {
				s.t.Fatalf("AcquireIssued by %q of %q's entry: %v with %q, want in flight with %q", c.other, c.holder, res.State, res.Fingerprint, c.fp)
			}
			s.is(s.Store.Extend(s.ctx, k, c.other, minute), storage.ErrNotOwner, fmt.Sprintf("Extend by %q of %q's entry", c.other, c.holder))
			s.is(s.Store.Release(s.ctx, k, c.other), storage.ErrNotOwner, fmt.Sprintf("Release by %q of %q's entry", c.other, c.holder))
			s.is(s.Store.Complete(s.ctx, k, c.other, []byte("r"), hour), storage.ErrNotOwner, fmt.Sprintf("Complete by %q of %q's entry", c.other, c.holder))
			if err := s.Store.Extend(s.ctx, k, c.holder, minute); err != nil {
				s.t.Fatalf("Extend by %q: %v", c.holder, err)
			}
			if err := s.Store.Release(s.ctx, k, c.holder); err != nil {
				s.t.Fatalf("Release by %q: %v", c.holder, err)
			}
			s.wantAcquired(s.acquireIssued(k, c.other, c.fp, minute))
			s.complete(k, c.other, []byte("r"), hour)
			s.wantDone(k, c.fp, []byte("r"))
		}
	}},
	{"AcquireIssuedOneWinner", func(s *suite) {
		k := s.key()
		s.issue(k, hour)
		s.oneWinner(k, "AcquireIssued", s.issuer().AcquireIssued)
	}},
}

// oneWinner makes 50 owners acquire k at once with acquire (named what):
// exactly one must hold it, and the others see it in flight with the
// winner's fingerprint. The winner then completes it.
func (s *suite) oneWinner(k, what string, acquire func(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error)) {
	const n = 50
	results := make([]storage.Result, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			res, err := acquire(s.ctx, k, fmt.Sprint("owner-", i), fmt.Sprint("fp-", i), minute)
			if err != nil {
				s.t.Errorf("owner-%d: %s: %v", i, what, err)
			}
			results[i] = res
		})
	}
	close(start)
	wg.Wait()
	if s.t.Failed() {
		return
	}
	winner := -1
	for i, res := range results {
		if res.State != storage.Acquired {
			continue
		}
		if winner >= 0 {
			s.t.Fatalf("%s: owner-%d and owner-%d both acquired the key", what, winner, i)
		}
		winner = i
	}
	if winner < 0 {
		s.t.Fatalf("%s: none of %d concurrent owners acquired the key", what, n)
	}
	for i, res := range results {
		if i != winner && (res.State != storage.InFlight || res.Fingerprint != fmt.Sprint("fp-", winner)) {
			s.t.Fatalf("%s: owner-%d: %v with fingerprint %q, want in flight with the winner's %q", what, i, res.State, res.Fingerprint, fmt.Sprint("fp-", winner))
		}
	}
	s.complete(k, fmt.Sprint("owner-", winner), []byte("r"), hour)
}

type suite struct {
	Harness
	t   *testing.T
	ctx context.Context
}

// key returns a key no other subtest uses.
func (s *suite) key() string { return "storagetest:" + rand.Text() }

// short is a lease or TTL to let run out: 50ms on a real clock, where the
// suite polls until it has, and a minute when the clock can be moved past
// it.
func (s *suite) short() time.Duration {
	if s.Advance != nil {
		return minute
	}
	return 50 * time.Millisecond
}

// issuer returns the store as a storage.Issuer, skipping the test when it
// is not one.
func (s *suite) issuer() storage.Issuer {
	i, ok := s.Store.(storage.Issuer)
	if !ok {
		s.t.Skip("the store does not implement storage.Issuer")
	}
	return i
}

func (s *suite) issue(key string, ttl time.Duration) {
	s.t.Helper()
	if err := s.issuer().Issue(s.ctx, key, ttl); err != nil {
		s.t.Fatalf("Issue(%q, %v): %v", key, ttl, err)
	}
}

func (s *suite) acquireIssued(key, owner, fp string, lease time.Duration) storage.Result {
	s.t.Helper()
	res, err := s.issuer().AcquireIssued(s.ctx, key, owner, fp, lease)
	if err != nil {
		s.t.Fatalf("AcquireIssued(%q, %q, %q, %v): %v", key, owner, fp, lease, err)
	}
	return res
}

// issuable returns a probe that reports whether key is free, by issuing
// it: that fails with ErrExists, changing nothing, while the entry lives,
// and issues the key (for an hour) once it is gone.
func (s *suite) issuable(key string) func() bool {
	return func() bool {
		s.t.Helper()
		err := s.issuer().Issue(s.ctx, key, hour)
		if err != nil && !errors.Is(err, storage.ErrExists) {
			s.t.Fatalf("Issue(%q): %v, want nil or ErrExists", key, err)
		}
		return err == nil
	}
}

// inTime runs body, a clause whose verdict needs some of its steps to
// happen within d of an earlier one, on a real clock that a loaded machine
// may stretch past it. body gets d (s.short() at first) and returns false
// when it found that too much time had gone by (see late) for what it saw
// to mean anything; it then runs again, with fresh keys and d four times
// longer, twice at most, and the test is skipped if even 800 ms were not
// enough. With Advance, time passes only when the suite says so: body
// runs once.
func (s *suite) inTime(body func(d time.Duration) bool) {
	s.t.Helper()
	d := s.short()
	for range 3 {
		if body(d) {
			return
		}
		s.t.Logf("the machine took longer than %v between two steps: trying again with %v", d, 4*d)
		d *= 4
	}
	s.t.Skipf("the machine took longer than %v between two steps, three times: no verdict", d/4)
}

// late reports whether d has passed since start on a real clock: a step
// meant to come within d of start came too late for its answer to be
// checked. Never with Advance.
func (s *suite) late(start time.Time, d time.Duration) bool {
	return s.Advance == nil && time.Since(start) >= d
}

// pass lets d go by: it moves the clock with Advance, or waits on a real
// clock, where waiting is all there is.
func (s *suite) pass(d time.Duration) {
	if s.Advance != nil {
		s.Advance(d)
		return
	}
	time.Sleep(d)
}

func (s *suite) acquire(key, owner, fp string, lease time.Duration) storage.Result {
	s.t.Helper()
	res, err := s.Store.Acquire(s.ctx, key, owner, fp, lease)
	if err != nil {
		s.t.Fatalf("Acquire(%q, %q, %q, %v): %v", key, owner, fp, lease, err)
	}
	return res
}

func (s *suite) complete(key, owner string, rec []byte, ttl time.Duration) {
	s.t.Helper()
	if err := s.Store.Complete(s.ctx, key, owner, rec, ttl); err != nil {
		s.t.Fatalf("Complete(%q, %q, %d bytes, %v): %v", key, owner, len(rec), ttl, err)
	}
}

// wantAcquired checks that res says Acquired and nothing else.
func (s *suite) wantAcquired(res storage.Result) {
	s.t.Helper()
	if res.State != storage.Acquired || res.Fingerprint != "" || res.LeaseLeft != 0 || res.Record != nil {
		s.t.Fatalf("Acquire: %+v, want State Acquired and every other field empty", res)
	}
}

func (s *suite) wantState(res storage.Result, want storage.State) {
	s.t.Helper()
	if res.State != want {
		s.t.Fatalf("Acquire: state %v, want %v (%+v)", res.State, want, res)
	}
}

// wantInFlight checks, as another owner, that key is held with fingerprint
// fp, and returns what that Acquire found.
func (s *suite) wantInFlight(key, fp string) storage.Result {
	s.t.Helper()
	res := s.acquire(key, "storagetest-observer", "observer's fingerprint", minute)
	if res.State != storage.InFlight || res.Fingerprint != fp {
		s.t.Fatalf("entry is %v with fingerprint %q, want in flight with %q", res.State, res.Fingerprint, fp)
	}
	return res
}

// wantDone checks, as another owner, that key is done with fp and rec.
func (s *suite) wantDone(key, fp string, rec []byte) {
	s.t.Helper()
	res := s.acquire(key, "storagetest-observer", "observer's fingerprint", minute)
	if res.State != storage.Done || res.Fingerprint != fp || !bytes.Equal(res.Record, rec) {
		s.t.Fatalf("entry is %v with fingerprint %q and record %q, want done with %q and %q", res.State, res.Fingerprint, res.Record, fp, rec)
	}
}

func (s *suite) is(err, want error, what string) {
	s.t.Helper()
	if !errors.Is(err, want) {
		s.t.Fatalf("%s: error %v, want one wrapping %v", what, err, want)
	}
}

// gone returns a probe that reports whether key is free, by acquiring it
// as a new owner: that changes nothing while the entry lives, and takes
// the key (with fingerprint "fp-probe") once it is gone.
func (s *suite) gone(key string) func() bool {
	return func() bool {
		s.t.Helper()
		return s.acquire(key, "storagetest-probe", "fp-probe", minute).State == storage.Acquired
	}
}

// expire checks that an entry given d at start (taken before the call
// that set it) lives for d and then goes, as the probe gone tells.
//
// With Advance it moves the clock to 1ms short of d (the entry must be
// there) and then past it (it must be gone). On a real clock it polls, for
// at most ten seconds after d, and fails if the entry went before d had passed
// since start.
func (s *suite) expire(start time.Time, d time.Duration, gone func() bool) {
	s.t.Helper()
	if s.Advance != nil {
		s.Advance(d - time.Millisecond)
		if gone() {
			s.t.Fatalf("entry gone 1ms before its %v ran out", d)
		}
		s.Advance(2 * time.Millisecond)
		if !gone() {
			s.t.Fatalf("entry still there 1ms after its %v ran out", d)
		}
		return
	}
	// Generous: a server expires an entry it is asked about at once, and
	// only a broken store waits this long; a loaded machine may take
	// seconds to schedule the polls.
	deadline := start.Add(d + 10*time.Second)
	for !gone() {
		if time.Now().After(deadline) {
			s.t.Fatalf("entry still there %v after it was given %v", time.Since(start).Round(time.Millisecond), d)
		}
		time.Sleep(d / 10) // a real server's clock: polling is all there is
	}
	if since := time.Since(start); since < d {
		s.t.Fatalf("entry gone after %v, before its %v ran out", since, d)
	}
}

// eventually runs try on fresh keys until it reports true, up to 20
// times. With Advance no time passes, so the first try must succeed; on a
// real clock a millisecond may run out between two calls, but not every
// time.
func (s *suite) eventually(failure string, try func(key string) bool) {
	s.t.Helper()
	tries := 20
	if s.Advance != nil {
		tries = 1
	}
	for range tries {
		if try(s.key()) {
			return
		}
	}
	s.t.Fatalf("%s (%d tries)", failure, tries)
}
