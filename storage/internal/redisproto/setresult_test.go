package redisproto

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
)

// TestAppendProcessing checks the value of Acquire's SET byte for byte.
func TestAppendProcessing(t *testing.T) {
	at := time.UnixMilli(1_800_000_000_123)
	got := string(AppendProcessing(nil, at, "fp", "owner"))
	if want := "T\x01\xa3\x18\x5c\x50\x7bP\x02fpowner"; got != want {
		t.Fatalf("AppendProcessing = %q, want %q", got, want)
	}
	if s := stampTime(string(AppendStamp(nil, at))); !s.Equal(at) {
		t.Fatalf("stamp reads back as %v, want %v", s, at)
	}
	for x, want := range map[uint64]string{1: "\x01", 127: "\x7f", 128: "\x80\x01", 300: "\xac\x02", 16384: "\x80\x80\x01"} {
		if got := string(AppendUvarint(nil, x)); got != want {
			t.Errorf("AppendUvarint(%d) = %q, want %q", x, got, want)
		}
	}
}

// TestSetResult maps every answer of an Acquire's SET NX GET, as the
// scripts' parse reads the same values.
func TestSetResult(t *testing.T) {
	const st = "T\x01\xa3\x18\x5e\x3a\x7b"
	for _, c := range []struct {
		v     string
		found bool
		state storage.State
		next  Next
		fp    string
		rec   string
	}{
		{"", false, storage.Acquired, Answered, "", ""},
		{st + "C\x02fp\x01orecord", true, storage.Done, Answered, "fp", "record"},
		{"D\x02fprecord", true, storage.Done, Answered, "fp", "record"},
		{st + "P\x02fpother", true, storage.InFlight, AskLeaseLeft, "fp", ""},
		{"P\x02fpother", true, storage.InFlight, AskLeaseLeft, "fp", ""},
		{st + "Q\x02fp\x0260other", true, storage.InFlight, AskLeaseLeft, "fp", ""},
		{st + "P\x02fpme", true, 0, RunAcquire, "", ""},
		{st + "Q\x02fp\x0260me", true, 0, RunAcquire, "", ""},
		{st + "I60000", true, 0, RunAcquire, "", ""},
	} {
		res, next, err := SetResult(c.v, c.found, "me")
		if err != nil || res.State != c.state || next != c.next || res.Fingerprint != c.fp || string(res.Record) != c.rec {
			t.Errorf("SetResult(%q): %+v, %v, %v; want %v, %v, fingerprint %q, record %q", c.v, res, next, err, c.state, c.next, c.fp, c.rec)
		}
	}
	// The values redisprototest's CorruptValue puts under a key.
	for _, v := range []string{
		"", "garbage", "D", "P", "P\x00", "P\x02fp", "X\x00abc", "D\x09short", "\x00\x00",
		"I", "I0", "I01", "I-5", "I5x", "I 5", "I1.5", "I1e3", "I1234567890123456", "i5",
		"Q", "Q\x00", "Q\x00\x00o", "Q\x00\x015", "Q\x00\x025", "Q\x02fp\x025o", "Q\x00\x010o", "Q\x00\x02x1o",
		"Q\x09short", "Q\x00\x00", "Q\x00\x1012345678901234567o",
		"C", "C\x00", "C\x02fp", "C\x09short", "C\x00\x00", "C\x00\x00rec", "C\x00\x80\x00o", "C\x00\x05own",
		"C\x02fp\x80", "C\x00\x81", "C\x00\xff\xff\xff\xff\xff\x01o", "C\x00\x80\x01" + strings.Repeat("o", 127),
		"T", "T\x00", "T123456", "T\x00\x00\x00\x00\x00P\x00o", "T123456garbage", "T123456D\x00r",
		"T123456T123456P\x00o", "T123456P\x00", "T123456C\x00\x00", "T123456I", "T123456Q\x00\x00o",
	} {
		if res, next, err := SetResult(v, true, "o"); !errors.Is(err, ErrCorrupt) || res.State != 0 || next != Answered {
			t.Errorf("SetResult(%q): %+v, %v, %v; want ErrCorrupt", v, res, next, err)
		}
	}
	for pttl, want := range map[int64]time.Duration{1500: 1500 * time.Millisecond, 0: time.Millisecond, -2: time.Millisecond} {
		if got := LeaseLeft(pttl); got != want {
			t.Errorf("LeaseLeft(%d) = %v, want %v", pttl, got, want)
		}
	}
}

// TestVersion: a server older than 7.0 refuses, naming its version;
// one that does not tell, or tells something else, does not.
func TestVersion(t *testing.T) {
	info := "# Server\r\nredis_version:6.2.14\r\nredis_mode:standalone\r\n# Memory\r\nmaxmemory_policy:noeviction\r\n"
	if v, p := ParseVersion(info), ParsePolicy(info); v != "6.2.14" || p != "noeviction" {
		t.Fatalf("ParseVersion, ParsePolicy = %q, %q", v, p)
	}
	for version, refuses := range map[string]bool{
		"6.2.14": true, "5.0.7": true, "6.0": true, "7.0.0": false, "7.0.15": false, "7.2.4": false, "8.0.1": false,
		"10.0.0": false, "": false, "x.y": false, "unknown": false, "255.255.255": false,
	} {
		var tally Tally
		tally.Add("noeviction", "", nil)
		tally.Version(version, "")
		err, ok := tally.Verdict(nil)
		if !ok || errors.Is(err, ErrRedisVersion) != refuses {
			t.Errorf("version %q: %v, %v; want a refusal: %v", version, err, ok, refuses)
		}
		if refuses && err.Error() != "idem's Redis stores need Redis 7.0 or newer (SET NX GET); the server is "+version {
			t.Errorf("version %q: %q", version, err)
		}
	}
	// The version refuses before an evicting policy does, and on any node.
	var tally Tally
	tally.Add("allkeys-lru", "node a", nil)
	tally.Add("noeviction", "node b", nil)
	tally.Version("7.0.15", "node a")
	tally.Version("6.2.14", "node b")
	if err, ok := tally.Verdict(nil); !ok || !errors.Is(err, ErrRedisVersion) || !strings.HasSuffix(err.Error(), "6.2.14 (node b)") {
		t.Errorf("a cluster with an old node: %v, %v", err, ok)
	}
	refused := errors.New("ERR syntax error")
	if !SetRefused(refused.Error()) || SetRefused("WRONGTYPE Operation") {
		t.Error("SetRefused")
	}
	if err := VersionRefusal(refused); !errors.Is(err, ErrRedisVersion) || !errors.Is(err, refused) || !strings.Contains(err.Error(), "ERR syntax error") {
		t.Errorf("VersionRefusal: %v", err)
	}
}
