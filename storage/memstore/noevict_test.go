package memstore

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/storagetest"
)

// WithoutEviction: a full store refuses new keys with ErrFull, changing
// nothing, and keeps every live entry (done, issued, in flight); calls on
// keys that have an entry go on; expired and released entries make room.
func TestWithoutEviction(t *testing.T) {
	for _, c := range shardCounts {
		t.Run(c.name, func(t *testing.T) {
			s, clk := newStore(t, WithMaxEntries(3), WithoutEviction(), WithShards(c.n))
			acquire(t, s, "done", "o", time.Minute)
			complete(t, s, "done", time.Hour)
			if err := s.Issue(t.Context(), "issued", 2*time.Hour); err != nil {
				t.Fatal(err)
			}
			acquire(t, s, "flight", "o", 3*time.Hour)

			lenBefore, bytesBefore := s.Len(), s.Bytes()
			if _, err := s.Acquire(t.Context(), "new", "o", "fp", time.Minute); !errors.Is(err, storage.ErrFull) {
				t.Fatalf("Acquire of a new key on a full store: %v, want ErrFull", err)
			}
			if err := s.Issue(t.Context(), "new", time.Minute); !errors.Is(err, storage.ErrFull) {
				t.Fatalf("Issue of a new key on a full store: %v, want ErrFull", err)
			}
			if s.Len() != lenBefore || s.Bytes() != bytesBefore || s.holds("new") {
				t.Fatal("a refused call changed the store")
			}
			// Every live entry is kept, and calls on them go on.
			if res := acquire(t, s, "done", "other", time.Minute); res.State != storage.Done || string(res.Record) != "rec-done" {
				t.Fatalf("done: %v %q, want its record", res.State, res.Record)
			}
			if res := acquire(t, s, "flight", "o", 3*time.Hour); res.State != storage.Acquired {
				t.Fatalf("the owner's renewal: %v", res.State)
			}
			if res, err := s.AcquireIssued(t.Context(), "issued", "o", "fp", time.Minute); err != nil || res.State != storage.Acquired {
				t.Fatalf("AcquireIssued of the issued key: %v %v", res.State, err)
			}
			// A release frees a place...
			if err := s.Release(t.Context(), "flight", "o"); err != nil {
				t.Fatal(err)
			}
			acquire(t, s, "new", "o", time.Minute)
			if _, err := s.Acquire(t.Context(), "new2", "o", "fp", time.Minute); !errors.Is(err, storage.ErrFull) {
				t.Fatalf("full again: %v, want ErrFull", err)
			}
			// ... and so do expired entries: "new" (its lease) and the
			// issued key's processing entry (its lease) run out first;
			// "done" (its TTL, an hour) stays.
			clk.Advance(2 * time.Minute)
			acquire(t, s, "new2", "o", time.Minute)
			acquire(t, s, "new3", "o", time.Minute)
			if res := acquire(t, s, "done", "other", time.Minute); res.State != storage.Done {
				t.Fatalf("done after making room: %v, want it kept", res.State)
			}
			if _, err := s.Acquire(t.Context(), "new4", "o", "fp", time.Minute); !errors.Is(err, storage.ErrFull) {
				t.Fatalf("full of live entries: %v, want ErrFull", err)
			}
			clk.Advance(time.Hour) // done's TTL ends
			acquire(t, s, "new4", "o", time.Minute)
			s.checkInvariants(t)
		})
	}
}

// The contract holds with WithoutEviction (at the default bound).
func TestContractWithoutEviction(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		s, clk := newStore(t, WithoutEviction())
		return storagetest.Harness{Store: s, Advance: clk.Advance}
	})
}
