package storagetest

import (
	"time"

	"github.com/idemkit/idem/storage"
)

// committedCases check the clauses of committed entries (see Committed
// entries in the storage package documentation), for a store whose
// Harness has Commit.
var committedCases = []testCase{
	{"InFlightWhileLeaseRuns", func(s *suite) {
		k := s.committed("fp", hour)
		res := s.wantInFlight(k, "fp")
		if res.LeaseLeft < time.Millisecond || res.LeaseLeft > minute || res.Record != nil {
			s.t.Fatalf("committed entry in its lease: %+v, want in flight with a lease of at most %v and no record", res, minute)
		}
		s.complete(k, "o1", []byte("record"), hour)
		s.wantDone(k, "fp", []byte("record"))
	}},
	{"ReleaseEndsTheLeaseKeepsTheEntry", func(s *suite) {
		k := s.committed("fp", hour)
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			s.t.Fatalf("Release of the owner's committed entry: %v", err)
		}
		s.wantCommitted(k, "fp")
		s.wantCommitted(k, "fp") // the answer created nothing
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			s.t.Fatalf("Release of the owner's committed entry, resent: %v", err)
		}
		s.wantCommitted(k, "fp")
		if i, ok := s.Store.(storage.Issuer); ok {
			s.is(i.Issue(s.ctx, k, hour), storage.ErrExists, "Issue over a committed entry")
			res, err := i.AcquireIssued(s.ctx, k, "o3", "fp-3", minute)
			if err != nil || res.State != storage.Committed || res.Fingerprint != "fp" || res.Record != nil {
				s.t.Fatalf("AcquireIssued of a committed entry: %+v, %v; want committed with fingerprint %q", res, err, "fp")
			}
		}
	}},
	{"OwnerCompletesAfterItsLease", func(s *suite) {
		k := s.committed("fp", hour)
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			s.t.Fatal(err)
		}
		s.wantCommitted(k, "fp")
		// The middleware's completion, retried in the background, may come
		// after the lease: the response is stored all the same.
		s.complete(k, "o1", []byte("record"), hour)
		s.wantDone(k, "fp", []byte("record"))
	}},
	{"OtherOwners", func(s *suite) {
		k := s.committed("fp", hour)
		s.is(s.Store.Complete(s.ctx, k, "o2", []byte("x"), hour), storage.ErrNotOwner, "Complete of a committed entry by another owner")
		s.is(s.Store.Release(s.ctx, k, "o2"), storage.ErrNotOwner, "Release of a committed entry by another owner")
		s.is(s.Store.Extend(s.ctx, k, "o2", hour), storage.ErrNotOwner, "Extend of a committed entry by another owner")
		if err := s.Store.Extend(s.ctx, k, "o1", hour); err != nil {
			s.t.Fatalf("Extend of the owner's committed entry: %v", err)
		}
		if res := s.wantInFlight(k, "fp"); res.LeaseLeft <= minute {
			s.t.Fatalf("lease left %v: Extend did not renew the committed entry's lease to an hour", res.LeaseLeft)
		}
	}},
	{"OnlyTheOwnerCommits", func(s *suite) {
		s.needCommit()
		k := s.key()
		s.is(s.Commit(s.ctx, k, "o1", hour), storage.ErrNotOwner, "Commit of a missing entry")
		s.wantAcquired(s.acquire(k, "o1", "fp", minute))
		s.is(s.Commit(s.ctx, k, "o2", hour), storage.ErrNotOwner, "Commit by another owner")
		// Still o1's processing entry: its Release deletes it.
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			s.t.Fatal(err)
		}
		s.wantAcquired(s.acquire(k, "o3", "fp", minute))
	}},
	{"ExpiresAfterItsTTL", func(s *suite) {
		ttl := s.short()
		start := time.Now()
		k := s.committed("fp", ttl)
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			s.t.Fatal(err)
		}
		s.expire(start, ttl, func() bool {
			s.t.Helper()
			res := s.acquire(k, "o2", "fp-2", minute)
			if res.State != storage.Acquired && res.State != storage.Committed {
				s.t.Fatalf("committed entry before its TTL ran out: %v, want committed", res.State)
			}
			return res.State == storage.Acquired
		})
	}},
}

// committed returns a fresh key whose entry o1 acquired, with fp and a
// lease of a minute, and committed, to be kept for ttl. It skips the test
// when the harness has no Commit.
func (s *suite) committed(fp string, ttl time.Duration) string {
	s.t.Helper()
	s.needCommit()
	k := s.key()
	s.wantAcquired(s.acquire(k, "o1", fp, minute))
	if err := s.Commit(s.ctx, k, "o1", ttl); err != nil {
		s.t.Fatalf("Commit by the owner: %v", err)
	}
	return k
}

// needCommit skips the test when the harness has no Commit.
func (s *suite) needCommit() {
	if s.Commit == nil {
		s.t.Skip("the store has no committed entries (Harness.Commit is nil)")
	}
}

// wantCommitted checks, as another owner, that key is committed with fp.
func (s *suite) wantCommitted(key, fp string) {
	s.t.Helper()
	res := s.acquire(key, "storagetest-observer", "observer's fingerprint", minute)
	if res.State != storage.Committed || res.Fingerprint != fp || res.Record != nil || res.LeaseLeft != 0 {
		s.t.Fatalf("entry is %+v, want committed with fingerprint %q and no record", res, fp)
	}
}
