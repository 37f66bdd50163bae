package redisproto

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
)

func TestMilliseconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		time.Nanosecond:                    1,
		100 * time.Microsecond:             1,
		time.Millisecond:                   1,
		time.Millisecond + time.Nanosecond: 2,
		1500 * time.Millisecond:            1500,
		24 * time.Hour:                     86_400_000,
		time.Duration(1<<63 - 1):           9_223_372_036_855, // no overflow
	} {
		if got := Millis(d); got != want {
			t.Errorf("Millis(%v) = %d, want %d", d, got, want)
		}
	}
}

// TestReplyShapes feeds the reply mappers answers the scripts never give:
// each is an error, never a panic, and never a storage error.
func TestReplyShapes(t *testing.T) {
	for _, reply := range []any{
		nil, int64(2), int64(3), int64(-1), "", "D", "P\x00", "D\x03fp", "X\x00r", []any{}, []any{nil}, []any{"1"},
		"C", "C\x00", "C\x02fp", "C\x00\x00", "C\x00\x00r", "C\x00\x80\x00o", "C\x00\x02o", "C\x00\x80",
		"C\x00\xff\xff\xff\xff\xff\x01o", "C\x00\xff\xff\xff\xff\x0f",
		"T", "T\x00\x00\x00\x00\x00\x00", "T12345C\x00\x01or", "T123456P\x00o", "T123456T123456C\x00\x01or", "T123456D\x00r",
		[]any{int64(1)}, []any{int64(0)}, []any{int64(3), "fp", "r"},
		[]any{int64(2)}, []any{int64(2), "fp"}, []any{int64(2), int64(5), int64(5)},
		[]any{int64(2), "fp", "5"}, []any{int64(3), "fp", int64(5)}, []any{int64(2), "fp", int64(1), "extra"},
	} {
		res, err := AcquireResult(FromAny(reply))
		if !errors.Is(err, ErrReply) || res.State != 0 {
			t.Errorf("acquire reply %#v: %+v, %v; want an unexpected-reply error", reply, res, err)
		}
	}
	for _, reply := range []any{nil, int64(4), int64(-1), "", "D", "X\x00r", []any{int64(3)}, []any{int64(3), "fp", int64(5)}} {
		res, err := AcquireIssuedResult(FromAny(reply))
		if !errors.Is(err, ErrReply) || res.State != 0 {
			t.Errorf("acquire issued reply %#v: %+v, %v; want an unexpected-reply error", reply, res, err)
		}
	}
	for _, reply := range []any{nil, "1", int64(2), int64(-2), []any{int64(1)}, "OK"} {
		if err := OwnedResult(FromAny(reply)); !errors.Is(err, ErrReply) {
			t.Errorf("reply %#v: %v, want an unexpected-reply error", reply, err)
		}
		if err := IssueResult(FromAny(reply)); !errors.Is(err, ErrReply) {
			t.Errorf("issue reply %#v: %v, want an unexpected-reply error", reply, err)
		}
	}
}

func TestReplies(t *testing.T) {
	for _, c := range []struct {
		reply any
		want  storage.Result
		err   error
	}{
		{int64(1), storage.Result{State: storage.Acquired}, nil},
		{[]any{int64(2), "fp", int64(1500)}, storage.Result{State: storage.InFlight, Fingerprint: "fp", LeaseLeft: 1500 * time.Millisecond}, nil},
		{[]any{int64(2), "", int64(0)}, storage.Result{State: storage.InFlight, LeaseLeft: time.Millisecond}, nil},
		{[]any{int64(2), "", int64(-1)}, storage.Result{State: storage.InFlight, LeaseLeft: time.Millisecond}, nil},
		{"D\x02fp", storage.Result{State: storage.Done, Fingerprint: "fp", Record: []byte{}}, nil},
		{"D\x00", storage.Result{State: storage.Done, Record: []byte{}}, nil},
		{"D\x02fprecord", storage.Result{State: storage.Done, Fingerprint: "fp", Record: []byte("record")}, nil},
		{"C\x02fp\x01orecord", storage.Result{State: storage.Done, Fingerprint: "fp", Record: []byte("record")}, nil},
		{"C\x00\x01o", storage.Result{State: storage.Done, Record: []byte{}}, nil},
		{"C\x00\x80\x01" + strings.Repeat("o", 128) + "r", storage.Result{State: storage.Done, Record: []byte("r")}, nil},
		{"C\x00\x81\x00or", storage.Result{State: storage.Done, Record: []byte("r")}, nil}, // not the shortest form, as Lua reads it
		{"T\x01\xa3\x18\x5e\x3a\x7bC\x02fp\x01orecord", storage.Result{State: storage.Done, Fingerprint: "fp", Record: []byte("record")}, nil},
		{int64(0), storage.Result{}, ErrCorrupt},
	} {
		res, err := AcquireResult(FromAny(c.reply))
		if !errors.Is(err, c.err) || res.State != c.want.State || res.Fingerprint != c.want.Fingerprint ||
			res.LeaseLeft != c.want.LeaseLeft || string(res.Record) != string(c.want.Record) {
			t.Errorf("acquire reply %#v: %+v, %v; want %+v, %v", c.reply, res, err, c.want, c.err)
		}
	}
	for reply, want := range map[int64]error{1: nil, 0: storage.ErrNotOwner, -1: ErrCorrupt} {
		if err := OwnedResult(FromAny(reply)); !errors.Is(err, want) || (want == nil && err != nil) {
			t.Errorf("reply %d: %v, want %v", reply, err, want)
		}
	}
	for reply, want := range map[int64]error{1: nil, 0: storage.ErrExists, -1: ErrCorrupt} {
		if err := IssueResult(FromAny(reply)); !errors.Is(err, want) || (want == nil && err != nil) {
			t.Errorf("issue reply %d: %v, want %v", reply, err, want)
		}
	}
	for _, c := range []struct {
		reply any
		want  storage.State
		err   error
	}{
		{int64(3), storage.NotIssued, nil},
		{int64(1), storage.Acquired, nil},
		{[]any{int64(2), "fp", int64(1500)}, storage.InFlight, nil},
		{"D\x02fprecord", storage.Done, nil},
		{"C\x02fp\x01orecord", storage.Done, nil},
		{int64(0), 0, ErrCorrupt},
	} {
		res, err := AcquireIssuedResult(FromAny(c.reply))
		if !errors.Is(err, c.err) || res.State != c.want {
			t.Errorf("acquire issued reply %#v: %+v, %v; want %v, %v", c.reply, res, err, c.want, c.err)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	for info, want := range map[string]string{
		"# Memory\r\nused_memory:1\r\nmaxmemory:0\r\nmaxmemory_policy:allkeys-lru\r\nallocator_frag_ratio:1.0\r\n": "allkeys-lru",
		"maxmemory_policy:noeviction":            "noeviction",
		"maxmemory_policy:volatile-ttl\n":        "volatile-ttl",
		"# Memory\r\nmaxmemory:0\r\n":            "",
		"":                                       "",
		"x_maxmemory_policy:allkeys-lru\r\n":     "",
		"maxmemory_policy_other:allkeys-lru\r\n": "",
		"# Clients\nconnected_clients:1\r\n":     "",
	} {
		if got := ParsePolicy(info); got != want {
			t.Errorf("ParsePolicy(%q) = %q, want %q", info, got, want)
		}
	}
}
