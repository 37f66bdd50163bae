package redisproto

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
)

// TestSyntaxError: the refusal of an unknown SET option reads the same
// whether the client kept Redis's "ERR " (go-redis) or dropped it
// (rueidis, for every error reply).
func TestSyntaxError(t *testing.T) {
	for msg, want := range map[string]bool{
		"ERR syntax error": true, "syntax error": true, "ERR syntax error, something": true,
		"WRONGTYPE Operation against a key": false, "ERR unknown command": false, "": false,
	} {
		if SetRefused(msg) != want {
			t.Errorf("SetRefused(%q) = %v", msg, !want)
		}
	}
	// Any error reply to a native command but WRONGTYPE leaves the native
	// path for a while: a fork or a proxy may word its refusal otherwise.
	for msg, want := range map[string]bool{
		"ERR syntax error": true, "syntax error": true, "ERR unknown option 'IFEQ'": true, "LOADING": true,
		"WRONGTYPE Operation against a key": false,
	} {
		var n Native
		if n.Refused(msg) != want || n.Use() == want {
			t.Errorf("Refused(%q) = %v, want %v", msg, !want, want)
		}
	}
}

// TestNativeRefusal: a refusal forgets every entry held and keeps the
// store on the scripts for CheckEvery; then it tries again, and holds.
func TestNativeRefusal(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	n := &Native{Now: func() time.Time { return now }}
	p := AppendProcessing(nil, now, "fp", "o")
	n.Hold("k", "o", p, time.Minute)
	if got := n.Held("k", "o"); !bytes.Equal(got, p) {
		t.Fatalf("Held = %q, want %q", got, p)
	}
	if n.Held("k", "other") != nil || n.Held("k2", "o") != nil {
		t.Fatal("held for another owner or key")
	}
	if !n.Refused("ERR syntax error") {
		t.Fatal("not a refusal")
	}
	if n.Use() || n.Held("k", "o") != nil || n.Len() != 0 {
		t.Fatal("the refusal did not forget, or the store still uses the native path")
	}
	n.Hold("k", "o", p, time.Minute)
	if n.Len() != 0 {
		t.Fatal("held while refused")
	}
	now = now.Add(CheckEvery - time.Millisecond)
	if n.Use() {
		t.Fatal("native path tried again before CheckEvery")
	}
	now = now.Add(time.Millisecond)
	if !n.Use() {
		t.Fatal("native path not tried again after CheckEvery")
	}
	n.Hold("k", "o", p, time.Minute)
	if n.Held("k", "o") == nil {
		t.Fatal("not held after the refusal lapsed")
	}
	if (&Native{Off: true}).Use() {
		t.Fatal("Off uses the native path")
	}
}

// TestNativeBounded: entries whose lease ran out are forgotten as the
// map grows, a renewal keeps one, Drop forgets only the owner's, and no
// more than MaxHeld are held at once.
func TestNativeBounded(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	n := &Native{Now: func() time.Time { return now }}
	p := []byte("Tstamp.P\x02fpo")
	for i := range 1000 {
		n.Hold("old"+strconv.Itoa(i), "o", p, time.Second)
	}
	n.Renewed("old0", "o", time.Hour)
	n.Renewed("old1", "not-its-owner", time.Hour)
	now = now.Add(2 * time.Second)
	for i := range 2000 {
		n.Hold("new"+strconv.Itoa(i), "o", p, time.Second)
	}
	if n.Held("old0", "o") == nil {
		t.Error("the renewed entry was forgotten")
	}
	if got := n.Len(); got != 2001 {
		t.Errorf("%d entries held, want 2001: the 2000 new and the renewed one", got)
	}
	n.Drop("new0", "other")
	n.Drop("new1", "o")
	if n.Held("new0", "o") == nil || n.Held("new1", "o") != nil {
		t.Error("Drop forgot another owner's entry, or not the owner's")
	}
	for i := range MaxHeld + 10 {
		n.Hold("many"+strconv.Itoa(i), "o", p, time.Hour)
	}
	if got := n.Len(); got != MaxHeld {
		t.Errorf("%d entries held, want at most MaxHeld (%d)", got, MaxHeld)
	}
}

// TestAppendDone: the done entry written over a 'P' entry is the one the
// Complete script writes (its layout in the package doc), and reads back
// as done, with its owner and record.
func TestAppendDone(t *testing.T) {
	at := time.UnixMilli(0x0123456789ab)
	p := AppendProcessing(nil, at.Add(-time.Second), "fingerprint", "owner")
	got := AppendDone(nil, at, p, "owner", []byte("the record"))
	want := "T\x01\x23\x45\x67\x89\xab" + "C\x0bfingerprint" + "\x05owner" + "the record"
	if string(got) != want {
		t.Fatalf("AppendDone = %q, want %q", got, want)
	}
	res, _, err := SetResult(string(got), true, "another owner")
	if err != nil || res.State != storage.Done || string(res.Record) != "the record" || res.Fingerprint != "fingerprint" {
		t.Fatalf("the done entry reads back as %+v, %v", res, err)
	}
	long := string(bytes.Repeat([]byte("o"), 200))
	got = AppendDone(nil, at, AppendProcessing(nil, at, "", long), long, nil)
	if want := "T\x01\x23\x45\x67\x89\xab" + "C\x00" + "\xc8\x01" + long; string(got) != want {
		t.Fatalf("AppendDone with a 200-byte owner = %q, want %q", got, want)
	}
}

// TestDurability: the wait sent, and how its answer reads.
func TestDurability(t *testing.T) {
	if (Durability{}).On() || !(Durability{Replicas: 1}).On() || !(Durability{AOF: true}).On() {
		t.Fatal("On")
	}
	if got := (Durability{Replicas: 2}).Command(); strings.Join(got, " ") != "WAIT 2 100" {
		t.Errorf("WAIT: %q", got)
	}
	if got := (Durability{AOF: true, Replicas: 1, Timeout: 1500 * time.Microsecond}).Command(); strings.Join(got, " ") != "WAITAOF 1 1 2" {
		t.Errorf("WAITAOF: %q", got)
	}
	arr := func(a, b int64) Reply {
		return Reply{Kind: Array, Array: []Reply{{Kind: Int, Int: a}, {Kind: Int, Int: b}}}
	}
	for _, c := range []struct {
		d    Durability
		r    Reply
		err  error
		want bool // confirmed
	}{
		{Durability{Replicas: 1}, Reply{Kind: Int, Int: 1}, nil, true},
		{Durability{Replicas: 1}, Reply{Kind: Int, Int: 2}, nil, true},
		{Durability{Replicas: 2}, Reply{Kind: Int, Int: 1}, nil, false},
		{Durability{Replicas: 1}, Reply{Kind: String, Str: "1"}, nil, false},
		{Durability{Replicas: 1}, Reply{}, errors.New("i/o timeout"), false},
		{Durability{AOF: true}, arr(1, 0), nil, true},
		{Durability{AOF: true}, arr(0, 0), nil, false},
		{Durability{AOF: true, Replicas: 1}, arr(1, 0), nil, false},
		{Durability{AOF: true, Replicas: 1}, arr(1, 1), nil, true},
		{Durability{AOF: true}, Reply{Kind: Int, Int: 1}, nil, false},
		{Durability{AOF: true}, Reply{}, errors.New("ERR WAITAOF cannot be used when numlocal is set but appendonly is disabled."), false},
	} {
		err := c.d.Check(c.r, c.err)
		if (err == nil) != c.want || (err != nil && !errors.Is(err, storage.ErrNotDurable)) {
			t.Errorf("%+v answered %+v, %v: %v", c.d, c.r, c.err, err)
		}
	}
}
