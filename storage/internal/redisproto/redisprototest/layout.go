package redisprototest

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
)

// testKeysPrefixedWithTTL checks the layout byte for byte, as the store
// writes it (the stamp, the record, the lease and the TTL in
// milliseconds, rounded up), and that every key is under the prefix and
// has a TTL. It sets the server's clock, for the stamps.
func testKeysPrefixedWithTTL(t *testing.T, h Harness) {
	s := h.New("app:")
	ctx := t.Context()
	// The server's clock, for the stamps: TIME in a script answers it.
	t0 := time.UnixMilli(1_800_000_000_123)
	h.SetTime(t0)
	stamp := func(at time.Time) string {
		b := binary.BigEndian.AppendUint64(nil, uint64(at.UnixMilli()))
		return "T" + string(b[2:])
	}
	check := func(key, value string, ttl time.Duration) {
		t.Helper()
		if v, ok := get(t, h, key); !ok || v != value {
			t.Fatalf("%s holds %q (found: %v), want %q", key, v, ok, value)
		}
		if got := pttl(t, h, key); got != ttl {
			t.Fatalf("%s TTL %v, want %v", key, got, ttl)
		}
	}
	s.Acquire(ctx, "k", "owner", "fp", 1500*time.Millisecond)
	check("app:k", stamp(t0)+"P\x02fpowner", 1500*time.Millisecond)
	h.SetTime(t0.Add(time.Second))                    // a renewal keeps the stamp
	s.Acquire(ctx, "k", "owner", "fp", 2*time.Second) // renewed
	check("app:k", stamp(t0)+"P\x02fpowner", 2*time.Second)
	s.Extend(ctx, "k", "owner", 1001*time.Microsecond) // rounded up
	check("app:k", stamp(t0)+"P\x02fpowner", 2*time.Millisecond)
	h.SetTime(t0.Add(2 * time.Second)) // done: stamped anew
	rec := []byte{0, 1, 2}
	s.Complete(ctx, "k", "owner", rec, 36*time.Hour)
	rec[0] = 'x' // the caller reuses its buffer
	check("app:k", stamp(t0.Add(2*time.Second))+"C\x02fp\x05owner\x00\x01\x02", 36*time.Hour)
	s.Acquire(ctx, "sub", "o", "", 100*time.Microsecond)
	check("app:sub", stamp(t0.Add(2*time.Second))+"P\x00o", time.Millisecond)
	h.SetTime(t0.Add(3 * time.Second))
	s.Acquire(ctx, "k", "other", "x", time.Minute) // a replay changes nothing
	check("app:k", stamp(t0.Add(2*time.Second))+"C\x02fp\x05owner\x00\x01\x02", 36*time.Hour)
	// An owner of 128 bytes or more: its length takes two bytes or more.
	for _, c := range []struct {
		n   int
		len string
	}{{127, "\x7f"}, {128, "\x80\x01"}, {300, "\xac\x02"}, {16384, "\x80\x80\x01"}} {
		long := strings.Repeat("o", c.n)
		s.Acquire(ctx, "long", long, "fp", time.Minute)
		s.Complete(ctx, "long", long, []byte("r"), time.Hour)
		check("app:long", stamp(t0.Add(3*time.Second))+"C\x02fp"+c.len+long+"r", time.Hour)
		if err := s.Complete(ctx, "long", long, []byte("r"), time.Hour); err != nil {
			t.Fatalf("resend by an owner of %d bytes: %v", c.n, err)
		}
		if err := s.Complete(ctx, "long", long[1:], []byte("r"), time.Hour); !errors.Is(err, storage.ErrNotOwner) {
			t.Fatalf("complete by an owner of %d bytes, one byte short: %v, want ErrNotOwner", c.n, err)
		}
		if res, err := s.Acquire(ctx, "long", "x", "", time.Minute); err != nil || res.State != storage.Done || string(res.Record) != "r" || res.Fingerprint != "fp" {
			t.Fatalf("replay of an owner of %d bytes: %+v, %v", c.n, res, err)
		}
		do(t, h, "DEL", "app:long")
	}

	// Issued keys: stamped when issued, taken, released, done.
	at := func(d time.Duration) string { h.SetTime(t0.Add(d)); return stamp(t0.Add(d)) }
	st := at(10 * time.Second)
	s.Issue(ctx, "i", 90*time.Minute)
	check("app:i", st+"I5400000", 90*time.Minute)
	at(11 * time.Second)
	s.Issue(ctx, "i", time.Minute) // exists: changes nothing
	check("app:i", st+"I5400000", 90*time.Minute)
	st = at(12 * time.Second)
	s.AcquireIssued(ctx, "i", "owner", "fp", 30*time.Second)
	check("app:i", st+"Q\x02fp\x075400000owner", 30*time.Second)
	at(13 * time.Second)
	s.AcquireIssued(ctx, "i", "owner", "fp", time.Minute) // renewed
	check("app:i", st+"Q\x02fp\x075400000owner", time.Minute)
	s.Extend(ctx, "i", "owner", 1001*time.Microsecond) // rounded up
	check("app:i", st+"Q\x02fp\x075400000owner", 2*time.Millisecond)
	st = at(14 * time.Second)
	s.Release(ctx, "i", "owner") // back to issued, for the issue's whole TTL
	check("app:i", st+"I5400000", 90*time.Minute)
	st = at(15 * time.Second)
	s.Acquire(ctx, "i", "o", "", time.Second) // Acquire takes it too
	check("app:i", st+"Q\x00\x075400000o", time.Second)
	st = at(16 * time.Second)
	s.Complete(ctx, "i", "o", []byte("r"), time.Hour)
	check("app:i", st+"C\x00\x01or", time.Hour)
	s.Issue(ctx, "sub-i", time.Nanosecond) // rounded up
	check("app:sub-i", st+"I1", time.Millisecond)
	s.AcquireIssued(ctx, "never", "o", "", time.Minute) // writes nothing
	if ks := keys(t, h, "*"); len(ks) != 4 {
		t.Fatalf("keys %q, want app:k, app:sub, app:i and app:sub-i only", ks)
	}

	// The default prefix.
	h.New("").Acquire(ctx, "k", "o", "", time.Minute)
	if ks := keys(t, h, "*"); !slices.Contains(ks, "idem:k") {
		t.Fatalf("keys %q, want idem:k among them", ks)
	}
}

// testEveryKeyHasTTL runs every operation, looks the entries up and
// lists them, and checks that each key under the prefix has a TTL.
func testEveryKeyHasTTL(t *testing.T, h Harness) {
	ctx := t.Context()
	p := prefix("ttl")
	s := h.New(p)
	for _, o := range slices.Concat(Outcomes, Inspections) {
		if err := o.Run(ctx, s); err != nil {
			t.Fatalf("%s: %v", o.Name, err)
		}
	}
	s.Acquire(ctx, "sub", "o", "", 100*time.Microsecond+time.Minute)
	s.Acquire(ctx, "held", "o", "", time.Minute)
	s.Extend(ctx, "held", "o", 100*time.Microsecond+time.Minute)
	ks := keys(t, h, p+"*")
	if len(ks) != 4 {
		t.Fatalf("keys %q, want k, i, sub and held", ks)
	}
	for _, k := range ks {
		if d := pttl(t, h, k); d <= 0 {
			t.Errorf("%s PTTL %v, want a TTL", k, d)
		}
	}
	if d := pttl(t, h, p+"k"); d < 59*time.Second {
		t.Errorf("done entry PTTL %v, want about a minute", d)
	}
}
