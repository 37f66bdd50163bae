package redisprototest

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
)

// testCorruptValue puts values that are not entries under a key, strings
// and keys of other types (a hash, a list): every operation fails with
// storage.ErrCorrupt (not ErrNotOwner, not a panic) and leaves the value
// alone.
func testCorruptValue(t *testing.T, h Harness) {
	ctx := t.Context()
	p := prefix("corrupt")
	s := h.New(p)
	for _, v := range []string{
		"", "garbage", "D", "P", "P\x00", "P\x02fp", "X\x00abc", "D\x09short", "\x00\x00",
		"I", "I0", "I01", "I-5", "I5x", "I 5", "I1.5", "I1e3", "I1234567890123456", "i5",
		"Q", "Q\x00", "Q\x00\x00o", "Q\x00\x015", "Q\x00\x025", "Q\x02fp\x025o", "Q\x00\x010o", "Q\x00\x02x1o",
		"Q\x09short", "Q\x00\x00", "Q\x00\x1012345678901234567o",
		"C", "C\x00", "C\x02fp", "C\x09short", "C\x00\x00", "C\x00\x00rec", "C\x00\x80\x00o", "C\x00\x05own",
		"C\x02fp\x80", "C\x00\x81", "C\x00\xff\xff\xff\xff\xff\x01o", "C\x00\x80\x01" + strings.Repeat("o", 127),
		// Stamps: malformed, or over a value that is not an entry
		// (a 'D' entry is never stamped).
		"T", "T\x00", "T123456", "T\x00\x00\x00\x00\x00P\x00o", "T123456garbage", "T123456D\x00r",
		"T123456T123456P\x00o", "T123456P\x00", "T123456C\x00\x00", "T123456I", "T123456Q\x00\x00o",
	} {
		set(t, h, p+"bad", v, time.Minute)
		for name, f := range map[string]func() error{
			"acquire":  func() error { _, err := s.Acquire(ctx, "bad", "o", "", time.Minute); return err },
			"complete": func() error { return s.Complete(ctx, "bad", "o", []byte("r"), time.Minute) },
			"release":  func() error { return s.Release(ctx, "bad", "o") },
			"extend":   func() error { return s.Extend(ctx, "bad", "o", time.Minute) },
			"issue":    func() error { return s.Issue(ctx, "bad", time.Minute) },
			"acquire issued": func() error {
				_, err := s.AcquireIssued(ctx, "bad", "o", "", time.Minute)
				return err
			},
			"lookup": func() error { _, err := s.Lookup(ctx, "bad", true); return err },
			"remove": func() error { _, err := s.Remove(ctx, "bad", "any-version"); return err },
		} {
			err := f()
			if !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), "not an idem entry") {
				t.Errorf("%s over %q: %v, want storage.ErrCorrupt, saying the value is not an entry", name, v, err)
			}
		}
		if got, _ := get(t, h, p+"bad"); got != v {
			t.Errorf("value %q changed to %q", v, got)
		}
	}

	// A key of another type (GET answers WRONGTYPE): not an entry
	// either, and left alone.
	for typ, args := range map[string][]string{"hash": {"HSET", p + "bad", "f", "v"}, "list": {"RPUSH", p + "bad", "a"}} {
		do(t, h, "DEL", p+"bad")
		do(t, h, args...)
		for name, f := range map[string]func() error{
			"acquire":  func() error { _, err := s.Acquire(ctx, "bad", "o", "", time.Minute); return err },
			"complete": func() error { return s.Complete(ctx, "bad", "o", []byte("r"), time.Minute) },
			"release":  func() error { return s.Release(ctx, "bad", "o") },
			"extend":   func() error { return s.Extend(ctx, "bad", "o", time.Minute) },
			"issue":    func() error { return s.Issue(ctx, "bad", time.Minute) },
			"acquire issued": func() error {
				_, err := s.AcquireIssued(ctx, "bad", "o", "", time.Minute)
				return err
			},
			"lookup": func() error { _, err := s.Lookup(ctx, "bad", true); return err },
			"remove": func() error { _, err := s.Remove(ctx, "bad", "any-version"); return err },
		} {
			if err := f(); !errors.Is(err, storage.ErrCorrupt) {
				t.Errorf("%s over a %s: %v, want storage.ErrCorrupt", name, typ, err)
			}
		}
		if r := do(t, h, "TYPE", p+"bad"); r.Str != typ {
			t.Errorf("the %s is gone: TYPE answered %+v", typ, r)
		}
	}
}

// testOldDoneEntry: a done entry in the layout of a release before the
// owner was kept ('D', the fingerprint's length, the fingerprint, the
// record: no owner, no stamp), as a process of that release writes it
// during a rolling deploy, is replayed. Complete cannot prove that its
// owner wrote it, so it answers ErrNotOwner even with the same record;
// nothing changes the entry or its TTL.
func testOldDoneEntry(t *testing.T, h Harness) {
	ctx := t.Context()
	p := prefix("old")
	s := h.New(p)
	for _, c := range []struct{ value, fp, rec string }{
		{"D\x02fprecord", "fp", "record"},
		{"D\x00", "", ""},
		{"D\x00\x00\x01C\x05", "", "\x00\x01C\x05"}, // a record that looks like a new entry's tail
		{"D\x03abc", "abc", ""},
	} {
		set(t, h, p+"k", c.value, time.Hour)
		res, err := s.Acquire(ctx, "k", "o", "x", time.Minute)
		if err != nil || res.State != storage.Done || res.Fingerprint != c.fp || string(res.Record) != c.rec {
			t.Errorf("acquire over %q: %+v, %v; want done, fingerprint %q, record %q", c.value, res, err, c.fp, c.rec)
		}
		res, err = s.AcquireIssued(ctx, "k", "o", "x", time.Minute)
		if err != nil || res.State != storage.Done || res.Fingerprint != c.fp || string(res.Record) != c.rec {
			t.Errorf("acquire issued over %q: %+v, %v; want done", c.value, res, err)
		}
		if err := s.Complete(ctx, "k", "o", []byte(c.rec), time.Minute); !errors.Is(err, storage.ErrNotOwner) {
			t.Errorf("complete with the same record over %q: %v, want ErrNotOwner", c.value, err)
		}
		if err := s.Release(ctx, "k", "o"); !errors.Is(err, storage.ErrNotOwner) {
			t.Errorf("release over %q: %v, want ErrNotOwner", c.value, err)
		}
		if err := s.Extend(ctx, "k", "o", time.Minute); !errors.Is(err, storage.ErrNotOwner) {
			t.Errorf("extend over %q: %v, want ErrNotOwner", c.value, err)
		}
		if err := s.Issue(ctx, "k", time.Minute); !errors.Is(err, storage.ErrExists) {
			t.Errorf("issue over %q: %v, want ErrExists", c.value, err)
		}
		if got, _ := get(t, h, p+"k"); got != c.value {
			t.Errorf("value %q changed to %q", c.value, got)
		}
		if d := pttl(t, h, p+"k"); d <= 59*time.Minute {
			t.Errorf("PTTL %v, want the hour it was set with", d)
		}
	}
}

// listAll pages through s's entries with limit, and returns their keys,
// sorted, each once (SCAN may show a key twice).
func listAll(t *testing.T, s Store, limit int) []string {
	t.Helper()
	var got []string
	q := storage.Query{Limit: limit}
	for {
		page, err := s.List(t.Context(), q)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Entries {
			got = append(got, e.Key)
		}
		if page.Next == "" {
			break
		}
		q.Cursor = page.Next
	}
	slices.Sort(got)
	return slices.Compact(got)
}

// testInspectBesideOtherValues: under the store's prefix, values that
// are not entries (garbage, a hash) and entries of a release before the
// stamp sit beside the store's own. Lookup of garbage fails and Remove
// leaves it alone; Lookup of a missing key is ErrNotFound; List leaves
// them out and still lists every entry, whatever its limit; an unstamped
// entry shows a zero Since, which MinAge leaves out. A prefix with glob
// characters lists its own keys only.
func testInspectBesideOtherValues(t *testing.T, h Harness) {
	ctx := t.Context()
	p := prefix("inspect") + "[*?]\\:"
	s := h.New(p)
	other := h.New(strings.TrimSuffix(p, "[*?]\\:") + "x:")
	if _, err := other.Acquire(ctx, "not-mine", "o", "fp", time.Minute); err != nil {
		t.Fatal(err)
	}
	set(t, h, p+"garbage", "garbage", time.Minute)
	do(t, h, "HSET", p+"hash", "f", "v")
	do(t, h, "PEXPIRE", p+"hash", "60000")
	set(t, h, p+"old", "D\x02fprecord", time.Minute) // an older release's done entry
	want := []string{"a", "b", "c", "d", "e", "old"}
	for _, k := range want[:5] {
		if _, err := s.Acquire(ctx, k, "o", "fp", time.Minute); err != nil {
			t.Fatal(err)
		}
	}

	if _, err := s.Lookup(ctx, "garbage", false); err == nil || errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Lookup of garbage: %v, want an error saying it is not an entry", err)
	}
	if _, err := s.Remove(ctx, "garbage", "any-version"); err == nil {
		t.Errorf("Remove of garbage: nil, want an error")
	}
	if v, _ := get(t, h, p+"garbage"); v != "garbage" {
		t.Errorf("Remove of garbage changed it to %q, want it left alone", v)
	}
	if _, err := s.Lookup(ctx, "missing", false); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Lookup of a missing key: %v, want ErrNotFound", err)
	}
	old, err := s.Lookup(ctx, "old", true)
	if err != nil || old.State != storage.Done || !old.Since.IsZero() || string(old.Record) != "record" || old.Size != 6 {
		t.Errorf("Lookup of an unstamped done entry: %+v, %v; want done, no Since, its record", old, err)
	}
	for _, limit := range []int{1, 2, 100} {
		if got := listAll(t, s, limit); !slices.Equal(got, want) {
			t.Errorf("List with limit %d: %q, want %q", limit, got, want)
		}
	}
	page, err := s.List(ctx, storage.Query{MinAge: time.Nanosecond, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range page.Entries {
		if e.Key == "old" {
			t.Errorf("List with a MinAge shows an entry of unknown age: %+v", e)
		}
	}
}
