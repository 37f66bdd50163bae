package storagetest

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem/storage"
)

// inspectorCases check the clauses of storage.Inspector, for a store that
// implements it.
var inspectorCases = []testCase{
	{"LookupInFlight", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", hour)
		e := s.lookup(k, true)
		s.wantEntry(e, k, storage.InFlight, "fp", hour)
		if e.LeaseLeft <= hour-minute || e.LeaseLeft > hour || e.Size != 0 || e.Record != nil {
			s.t.Fatalf("Lookup of an entry in flight: %+v, want a lease left of about an hour, no size, no record", e)
		}
		s.wantInFlight(k, "fp") // the lookup took nothing
		s.pass(time.Millisecond)
		if err := s.Store.Extend(s.ctx, k, "o1", 2*hour); err != nil {
			s.t.Fatal(err)
		}
		again := s.lookup(k, false)
		if !again.Since.Equal(e.Since) || again.LeaseLeft <= hour {
			s.t.Fatalf("after Extend: since %v, lease left %v; want the acquisition's %v and about two hours", again.Since, again.LeaseLeft, e.Since)
		}
		s.complete(k, "o1", []byte("r"), hour)
	}},
	{"LookupDone", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", minute)
		acquired := s.lookup(k, false)
		s.pass(10 * time.Millisecond)
		s.complete(k, "o1", []byte("a record"), hour)
		e := s.lookup(k, false)
		s.wantEntry(e, k, storage.Done, "fp", hour)
		if !e.Since.After(acquired.Since) {
			s.t.Fatalf("a done entry: since %v, want when it was completed, after it was acquired at %v", e.Since, acquired.Since)
		}
		if e.Size != len("a record") || e.Record != nil || e.LeaseLeft != 0 {
			s.t.Fatalf("Lookup of a done entry without its record: %+v, want size %d, no record, no lease", e, len("a record"))
		}
		if e := s.lookup(k, true); string(e.Record) != "a record" || e.Size != len("a record") {
			s.t.Fatalf("Lookup of a done entry with its record: %+v, want record %q", e, "a record")
		}
		s.wantDone(k, "fp", []byte("a record"))
	}},
	{"LookupIssued", func(s *suite) {
		k := s.key()
		s.issue(k, hour)
		issued := s.lookup(k, true)
		s.wantEntry(issued, k, storage.Issued, "", hour)
		s.pass(10 * time.Millisecond)
		s.wantAcquired(s.acquireIssued(k, "o1", "fp", minute)) // it was still issued
		taken := s.lookup(k, false)
		s.wantEntry(taken, k, storage.InFlight, "fp", minute)
		if !taken.Since.After(issued.Since) {
			s.t.Fatalf("an issued entry taken: since %v, want after its issue at %v", taken.Since, issued.Since)
		}
		s.pass(10 * time.Millisecond)
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			s.t.Fatal(err)
		}
		again := s.lookup(k, false)
		s.wantEntry(again, k, storage.Issued, "", hour)
		if !again.Since.After(taken.Since) {
			s.t.Fatalf("an issued entry released: since %v, want after it was taken at %v", again.Since, taken.Since)
		}
	}},
	{"LookupCommitted", func(s *suite) {
		k := s.committed("fp", hour)
		e := s.lookup(k, false)
		if e.Key != k || e.State != storage.Committed || e.Fingerprint != "fp" || e.LeaseLeft <= 0 || e.LeaseLeft > minute {
			s.t.Fatalf("Lookup of a committed entry in its lease: %+v, want committed, fingerprint %q, a lease left of at most a minute", e, "fp")
		}
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			s.t.Fatal(err)
		}
		if e := s.lookup(k, false); e.State != storage.Committed || e.LeaseLeft != 0 {
			s.t.Fatalf("Lookup of a committed entry after its lease: %+v, want committed with no lease left", e)
		}
	}},
	{"LookupMissing", func(s *suite) {
		k := s.key()
		_, err := s.inspector().Lookup(s.ctx, k, true)
		s.is(err, storage.ErrNotFound, "Lookup of a missing key")
		s.wantAcquired(s.acquire(k, "o1", "fp", minute)) // it created nothing
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			s.t.Fatal(err)
		}
		_, err = s.inspector().Lookup(s.ctx, k, false)
		s.is(err, storage.ErrNotFound, "Lookup of a released key")
	}},
	{"LookupExpired", func(s *suite) {
		k := s.key()
		start := time.Now()
		s.acquire(k, "o1", "fp", s.short())
		s.expire(start, s.short(), func() bool {
			s.t.Helper()
			_, err := s.inspector().Lookup(s.ctx, k, false)
			if err != nil && !errors.Is(err, storage.ErrNotFound) {
				s.t.Fatal(err)
			}
			return err != nil
		})
	}},
	{"List", func(s *suite) {
		want := s.oneOfEach()
		for _, state := range []storage.State{0, storage.InFlight, storage.Done, storage.Committed, storage.Issued} {
			for _, limit := range []int{1, 3, 0} {
				got := s.listOwn(storage.Query{State: state, Limit: limit}, want)
				for k, st := range want {
					if state != 0 && st != state {
						if _, ok := got[k]; ok {
							s.t.Fatalf("List of %v entries (limit %d) shows %s, which is %v", state, limit, k, st)
						}
						continue
					}
					if e, ok := got[k]; !ok || e.State != st {
						s.t.Fatalf("List of state %v (limit %d): %s is %+v (listed: %t), want it listed as %v", state, limit, k, e, ok, st)
					}
				}
			}
		}
	}},
	{"ListMinAge", func(s *suite) {
		want := s.oneOfEach()
		if got := s.listOwn(storage.Query{MinAge: hour}, want); len(got) != 0 {
			s.t.Fatalf("List of entries at least an hour old shows %d of this test's new entries", len(got))
		}
		if s.Advance == nil {
			return
		}
		s.pass(2 * minute)
		k := s.key()
		s.acquire(k, "o2", "fp", hour)
		want[k] = storage.InFlight
		got := s.listOwn(storage.Query{MinAge: minute}, want)
		if _, ok := got[k]; ok || len(got) != len(want)-1 {
			s.t.Fatalf("List of entries at least a minute old: %d entries of this test, want the %d made two minutes ago", len(got), len(want)-1)
		}
	}},
	{"ListInvalid", func(s *suite) {
		for _, q := range []storage.Query{
			{State: storage.Acquired},
			{State: storage.NotIssued},
			{MinAge: -time.Second},
			{Cursor: "not a cursor \x00"},
		} {
			_, err := s.inspector().List(s.ctx, q)
			s.is(err, storage.ErrInvalid, fmt.Sprintf("List(%+v)", q))
		}
	}},
	{"RemoveInFlight", func(s *suite) {
		// The entry Lookup showed is the one removed.
		k := s.key()
		s.acquire(k, "o1", "fp", hour)
		e := s.remove(k)
		s.wantEntry(e, k, storage.InFlight, "fp", hour)
		s.wantAcquired(s.acquire(k, "o2", "fp-2", minute))
		s.is(s.Store.Complete(s.ctx, k, "o1", []byte("r"), hour), storage.ErrNotOwner, "Complete by the owner of a removed entry")
	}},
	{"RemoveDone", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", minute)
		s.complete(k, "o1", []byte("record"), hour)
		e := s.remove(k)
		s.wantEntry(e, k, storage.Done, "fp", hour)
		if e.Size != len("record") || e.Record != nil {
			s.t.Fatalf("Remove of a done entry answered %+v, want its size and no record", e)
		}
		s.wantAcquired(s.acquire(k, "o2", "fp", minute)) // runs again
	}},
	{"RemoveIssued", func(s *suite) {
		k := s.key()
		s.issue(k, hour)
		s.wantEntry(s.remove(k), k, storage.Issued, "", hour)
		s.wantState(s.acquireIssued(k, "o1", "fp", minute), storage.NotIssued)
	}},
	{"RemoveCommitted", func(s *suite) {
		k := s.committed("fp", hour)
		if e := s.remove(k); e.State != storage.Committed || e.Fingerprint != "fp" {
			s.t.Fatalf("Remove of a committed entry answered %+v, want it committed with fingerprint %q", e, "fp")
		}
		s.wantAcquired(s.acquire(k, "o2", "fp", minute))
	}},
	{"RemoveMissing", func(s *suite) {
		k := s.key()
		_, err := s.inspector().Remove(s.ctx, k, "some-version")
		s.is(err, storage.ErrNotFound, "Remove of a missing key")
		s.wantAcquired(s.acquire(k, "o1", "fp", minute))
	}},
	{"RemoveWithoutVersion", func(s *suite) {
		k := s.key()
		s.acquire(k, "o1", "fp", hour)
		_, err := s.inspector().Remove(s.ctx, k, "")
		s.is(err, storage.ErrInvalid, "Remove without a version")
		s.wantInFlight(k, "fp")
	}},
	{"RemoveCompletedMeanwhile", func(s *suite) {
		// The operator saw the execution in flight; it completed before
		// the removal reached the store: the done record stays, or a
		// retry would run the work a second time.
		k := s.key()
		s.acquire(k, "o1", "fp", hour)
		shown := s.lookup(k, false)
		s.complete(k, "o1", []byte("record"), hour)
		s.wantChanged(k, shown, storage.Done)
		s.wantDone(k, "fp", []byte("record"))
		now := s.lookup(k, false)
		if e, err := s.inspector().Remove(s.ctx, k, now.Version); err != nil || e.State != storage.Done {
			s.t.Fatalf("Remove with the done entry's own version: %+v, %v; want it removed", e, err)
		}
	}},
	{"RemoveReacquired", func(s *suite) {
		// Shown in flight under o1, released, acquired by o2 (the same
		// state, another execution): not the entry that was shown.
		k := s.key()
		s.acquire(k, "o1", "fp", hour)
		shown := s.lookup(k, false)
		if err := s.Store.Release(s.ctx, k, "o1"); err != nil {
			s.t.Fatal(err)
		}
		s.wantAcquired(s.acquire(k, "o2", "fp", hour))
		s.wantChanged(k, shown, storage.InFlight)
		s.complete(k, "o2", []byte("r"), hour) // o2 still holds it
	}},
	{"RemoveTakenIssue", func(s *suite) {
		k := s.key()
		s.issue(k, hour)
		shown := s.lookup(k, false)
		s.wantAcquired(s.acquireIssued(k, "o1", "fp", minute))
		s.wantChanged(k, shown, storage.InFlight)
		s.complete(k, "o1", []byte("r"), hour)
	}},
	{"RemoveFencedMeanwhile", func(s *suite) {
		s.needCommit()
		k := s.key()
		s.wantAcquired(s.acquire(k, "o1", "fp", minute))
		shown := s.lookup(k, false)
		if err := s.Commit(s.ctx, k, "o1", hour); err != nil {
			s.t.Fatal(err)
		}
		s.wantChanged(k, shown, storage.Committed)
	}},
	{"VersionKeptByRenewal", func(s *suite) {
		// A renewal changes nothing an operator decides on: the entry
		// shown before it is still the one removed after it.
		k := s.key()
		s.acquire(k, "o1-a-long-owner-token", "fp", hour)
		shown := s.lookup(k, false)
		if shown.Version == "" || strings.ContainsAny(shown.Version, " \t\n") || strings.Contains(shown.Version, "o1-a-long-owner-token") {
			s.t.Fatalf("Version %q: want a non-empty token without spaces that does not reveal the owner", shown.Version)
		}
		s.pass(time.Millisecond)
		if err := s.Store.Extend(s.ctx, k, "o1-a-long-owner-token", 2*hour); err != nil {
			s.t.Fatal(err)
		}
		s.wantAcquired(s.acquire(k, "o1-a-long-owner-token", "fp", hour)) // a resend
		listed := s.listOwn(storage.Query{State: storage.InFlight}, map[string]storage.State{k: storage.InFlight})
		if v := s.lookup(k, false).Version; v != shown.Version || listed[k].Version != shown.Version {
			s.t.Fatalf("after a renewal: Lookup's version %q, List's %q; want %q still", v, listed[k].Version, shown.Version)
		}
		if e, err := s.inspector().Remove(s.ctx, k, shown.Version); err != nil || e.Version != shown.Version {
			s.t.Fatalf("Remove with the version shown before a renewal: %+v, %v; want it removed", e, err)
		}
	}},
	{"VersionsOfStates", func(s *suite) {
		// Each transition makes a new version; two entries' versions
		// never mix.
		k, other := s.key(), s.key()
		s.issue(k, hour)
		seen := map[string]string{}
		note := func(what string) {
			s.t.Helper()
			v := s.lookup(k, false).Version
			if prev, ok := seen[v]; ok {
				s.t.Fatalf("%s: version %q, the same as %s", what, v, prev)
			}
			seen[v] = what
		}
		note("issued")
		s.wantAcquired(s.acquireIssued(k, "o1", "fp", minute))
		note("taken by o1")
		s.complete(k, "o1", []byte("r"), hour)
		note("done")
		s.acquire(other, "o1", "fp", minute)
		s.wantChanged(other, s.lookup(k, false), storage.InFlight)
	}},
}

// wantChanged checks that Remove of key with the version of shown answers
// ErrChanged with the entry as it is now, in state now, and removes
// nothing.
func (s *suite) wantChanged(key string, shown storage.Entry, now storage.State) {
	s.t.Helper()
	e, err := s.inspector().Remove(s.ctx, key, shown.Version)
	s.is(err, storage.ErrChanged, fmt.Sprintf("Remove of an entry shown %v, now %v", shown.State, now))
	if e.Key != key || e.State != now || e.Version == shown.Version || e.Record != nil {
		s.t.Fatalf("Remove of a changed entry answered %+v, want the entry as it is now (%v, a new version)", e, now)
	}
	if got := s.lookup(key, false); got.State != now || got.Version != e.Version {
		s.t.Fatalf("after a refused Remove the entry is %+v, want it unchanged (%v, version %q)", got, now, e.Version)
	}
}

// inspector returns the store as a storage.Inspector, skipping the test
// when it is not one.
func (s *suite) inspector() storage.Inspector {
	i, ok := s.Store.(storage.Inspector)
	if !ok {
		s.t.Skip("the store does not implement storage.Inspector")
	}
	return i
}

func (s *suite) lookup(key string, withRecord bool) storage.Entry {
	s.t.Helper()
	e, err := s.inspector().Lookup(s.ctx, key, withRecord)
	if err != nil {
		s.t.Fatalf("Lookup(%q, %t): %v", key, withRecord, err)
	}
	return e
}

func (s *suite) remove(key string) storage.Entry {
	s.t.Helper()
	shown := s.lookup(key, false)
	e, err := s.inspector().Remove(s.ctx, key, shown.Version)
	if err != nil {
		s.t.Fatalf("Remove(%q, %q): %v", key, shown.Version, err)
	}
	if e.Version != shown.Version {
		s.t.Fatalf("Remove(%q, %q) answered version %q", key, shown.Version, e.Version)
	}
	if _, err := s.inspector().Lookup(s.ctx, key, false); !errors.Is(err, storage.ErrNotFound) {
		s.t.Fatalf("Lookup after Remove(%q): %v, want ErrNotFound", key, err)
	}
	return e
}

// wantEntry checks the fields every entry has: key, state, fingerprint,
// and a Since and an Expires d apart (the lease or TTL it was given just
// now), to the second.
func (s *suite) wantEntry(e storage.Entry, key string, state storage.State, fp string, d time.Duration) {
	s.t.Helper()
	if e.Key != key || e.State != state || e.Fingerprint != fp {
		s.t.Fatalf("entry %+v, want key %q, %v, fingerprint %q", e, key, state, fp)
	}
	if e.Since.IsZero() {
		s.t.Fatalf("entry %+v: no Since", e)
	}
	if got := e.Expires.Sub(e.Since); got < d-time.Second || got > d+time.Second {
		s.t.Fatalf("entry %+v: expires %v after its Since, want about %v", e, got, d)
	}
}

// oneOfEach makes an entry in each state the store has (in flight, done,
// and, where the store has them, issued and committed) and returns their
// keys and states.
func (s *suite) oneOfEach() map[string]storage.State {
	s.t.Helper()
	want := make(map[string]storage.State)
	k := s.key()
	s.acquire(k, "o1", "fp", hour)
	want[k] = storage.InFlight
	k = s.key()
	s.acquire(k, "o1", "fp", minute)
	s.complete(k, "o1", []byte("record"), hour)
	want[k] = storage.Done
	if i, ok := s.Store.(storage.Issuer); ok {
		k = s.key()
		if err := i.Issue(s.ctx, k, hour); err != nil {
			s.t.Fatal(err)
		}
		want[k] = storage.Issued
	}
	if s.Commit != nil {
		want[s.committed("fp", hour)] = storage.Committed
	}
	return want
}

// listOwn lists what q selects, page by page to the end, checking each
// page, and returns the entries listed whose keys are in own (the store
// may hold other tests' entries).
func (s *suite) listOwn(q storage.Query, own map[string]storage.State) map[string]storage.Entry {
	s.t.Helper()
	got := make(map[string]storage.Entry)
	limit := q.Limit
	if limit <= 0 {
		limit = storage.DefaultListLimit
	}
	for pages := 0; ; pages++ {
		if pages == 100_000 {
			s.t.Fatalf("List(%+v): no end after %d pages", q, pages)
		}
		p, err := s.inspector().List(s.ctx, q)
		if err != nil {
			s.t.Fatalf("List(%+v): %v", q, err)
		}
		if len(p.Entries) > limit {
			s.t.Fatalf("List(%+v): a page of %d entries", q, len(p.Entries))
		}
		for _, e := range p.Entries {
			if e.Record != nil || (q.State != 0 && e.State != q.State) {
				s.t.Fatalf("List(%+v) shows %+v", q, e)
			}
			if _, ok := own[e.Key]; ok {
				got[e.Key] = e
			}
		}
		if p.Next == "" {
			return got
		}
		if p.Next == q.Cursor {
			s.t.Fatalf("List(%+v): the next page's cursor is this page's", q)
		}
		q.Cursor = p.Next
	}
}
