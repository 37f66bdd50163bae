package redisprototest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
)

// testScriptsAreSafeToRunTwice sends each script twice, from two
// goroutines at once, as a client does when it resends a command after a
// read timeout or a network error: both answers are the first's.
func testScriptsAreSafeToRunTwice(t *testing.T, h Harness) {
	ctx := t.Context()
	s := h.New(prefix("twice"))
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
}

// testCompleteChecksTheOwnerOfADoneEntry: A's lease runs out while its
// handler runs, B acquires the key, runs and completes it with record R;
// A then completes with the very same R. That is a second execution, not
// a resend: A gets ErrNotOwner and the entry is left as B wrote it, its
// TTL not renewed. B's resend of its Complete is still nil.
func testCompleteChecksTheOwnerOfADoneEntry(t *testing.T, h Harness) {
	ctx := t.Context()
	p := prefix("owner")
	s := h.New(p)
	if res, err := s.Acquire(ctx, "k", "A", "fp", time.Minute); err != nil || res.State != storage.Acquired {
		t.Fatalf("A acquires: %+v, %v", res, err)
	}
	// A's lease runs out: its key expires, which to every script is a key
	// that is not there.
	do(t, h, "DEL", p+"k")
	if res, err := s.Acquire(ctx, "k", "B", "fp", time.Minute); err != nil || res.State != storage.Acquired {
		t.Fatalf("B acquires after A's lease ran out: %+v, %v", res, err)
	}
	rec := []byte("R: the same response")
	if err := s.Complete(ctx, "k", "B", rec, time.Hour); err != nil {
		t.Fatalf("B completes: %v", err)
	}
	before, _ := get(t, h, p+"k")
	ttl := pttl(t, h, p+"k")
	if err := s.Complete(ctx, "k", "A", rec, 2*time.Hour); !errors.Is(err, storage.ErrNotOwner) {
		t.Errorf("A completes with B's very record: %v, want ErrNotOwner (A ran a second time)", err)
	}
	if err := s.Complete(ctx, "k", "A", []byte("R2"), 2*time.Hour); !errors.Is(err, storage.ErrNotOwner) {
		t.Errorf("A completes with another record: %v, want ErrNotOwner", err)
	}
	if err := s.Complete(ctx, "k", "B", []byte("R2"), 2*time.Hour); !errors.Is(err, storage.ErrNotOwner) {
		t.Errorf("B completes again with another record: %v, want ErrNotOwner", err)
	}
	if err := s.Complete(ctx, "k", "B", rec, 2*time.Hour); err != nil {
		t.Errorf("B's resend: %v, want nil", err)
	}
	if after, _ := get(t, h, p+"k"); after != before {
		t.Errorf("entry changed from %q to %q", before, after)
	}
	if d := pttl(t, h, p+"k"); d > ttl || d > time.Hour {
		t.Errorf("PTTL %v after the refused completes, was %v: the TTL was renewed", d, ttl)
	}
	if res, err := s.Acquire(ctx, "k", "C", "fp", time.Minute); err != nil || res.State != storage.Done || string(res.Record) != string(rec) || res.Fingerprint != "fp" {
		t.Errorf("acquire after: %+v, %v; want done with B's record", res, err)
	}
	for name, f := range map[string]func() error{
		"release by B": func() error { return s.Release(ctx, "k", "B") },
		"extend by B":  func() error { return s.Extend(ctx, "k", "B", time.Minute) },
	} {
		if err := f(); !errors.Is(err, storage.ErrNotOwner) {
			t.Errorf("%s of the done entry: %v, want ErrNotOwner", name, err)
		}
	}
	if err := s.Issue(ctx, "k", time.Minute); !errors.Is(err, storage.ErrExists) {
		t.Errorf("issue over the done entry: %v, want ErrExists", err)
	}
}
