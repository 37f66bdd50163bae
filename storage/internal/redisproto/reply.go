package redisproto

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/idemkit/idem/storage"
)

var (
	// ErrCorrupt: the key holds something that is not an entry of the
	// store (a string that does not parse, or a key of another type). The
	// scripts change nothing then. It is [storage.ErrCorrupt] itself.
	ErrCorrupt = storage.ErrCorrupt
	// ErrReply: a script answered something it never answers.
	ErrReply = errors.New("unexpected reply")
)

// Kind is the shape of a [Reply].
type Kind uint8

// The shapes of a reply the scripts give: a Lua number becomes an
// integer, a Lua string a bulk string, a Lua table an array. Other is
// anything else (nil, an error, a status): never an answer of the
// scripts.
const (
	Other Kind = iota
	Int
	String
	Array
)

// Reply is a script's answer as a transport read it from its client. A
// transport converts its client's reply into one without copying the
// strings; the functions of this package map it to the store's result.
type Reply struct {
	Kind  Kind
	Int   int64   // when Kind is Int
	Str   string  // when Kind is String
	Array []Reply // when Kind is Array
}

// FromAny converts a reply in the shape go-redis's Cmd.Result gives it
// (int64, string, []any; anything else is Other).
func FromAny(v any) Reply {
	switch v := v.(type) {
	case int64:
		return Reply{Kind: Int, Int: v}
	case string:
		return Reply{Kind: String, Str: v}
	case []any:
		a := make([]Reply, len(v))
		for i, e := range v {
			a[i] = FromAny(e)
		}
		return Reply{Kind: Array, Array: a}
	}
	return Reply{}
}

// code reports the integer a reply holds, if it is one.
func (r Reply) code() (int64, bool) { return r.Int, r.Kind == Int }

// str reports the string a reply holds, if it is one.
func (r Reply) str() (string, bool) { return r.Str, r.Kind == String }

// AcquireResult maps the Acquire script's answer: 1 (acquired), the done
// entry's value, {2, fingerprint, pttl} (in flight) or 0 (not an entry).
func AcquireResult(r Reply) (storage.Result, error) {
	switch r.Kind {
	case Int:
		switch r.Int {
		case codeAcquired:
			return storage.Result{State: storage.Acquired}, nil
		case codeAcquireCorrupt:
			return storage.Result{}, ErrCorrupt
		}
	case String:
		return doneResult(r.Str)
	case Array:
		if len(r.Array) != 3 {
			break
		}
		code, ok0 := r.Array[0].code()
		fp, ok1 := r.Array[1].str()
		pttl, ok2 := r.Array[2].code()
		if ok0 && ok1 && ok2 && code == codeInFlight {
			return storage.Result{State: storage.InFlight, Fingerprint: fp, LeaseLeft: LeaseLeft(pttl)}, nil
		}
	}
	return storage.Result{}, Unexpected(r)
}

// AcquireIssuedResult maps the AcquireIssued script's answer: the Acquire
// script's, or 3 for not issued.
func AcquireIssuedResult(r Reply) (storage.Result, error) {
	if code, ok := r.code(); ok && code == codeNotIssued {
		return storage.Result{State: storage.NotIssued}, nil
	}
	return AcquireResult(r)
}

// IssueResult maps the Issue script's answer: nil, [storage.ErrExists],
// [ErrCorrupt] or [ErrReply].
func IssueResult(r Reply) error {
	code, ok := r.code()
	switch {
	case ok && code == codeOK:
		return nil
	case ok && code == codeExists:
		return storage.ErrExists
	case ok && code == codeCorrupt:
		return ErrCorrupt
	}
	return Unexpected(r)
}

// OwnedResult maps the answer of an owner-checked script (Complete,
// Release, Extend): nil, [storage.ErrNotOwner], [ErrCorrupt] or
// [ErrReply].
func OwnedResult(r Reply) error {
	code, ok := r.code()
	switch {
	case ok && code == codeOK:
		return nil
	case ok && code == codeNotOwner:
		return storage.ErrNotOwner
	case ok && code == codeCorrupt:
		return ErrCorrupt
	}
	return Unexpected(r)
}

// EntryOf maps the Inspect script's answer for key, and returns the
// server's time when it answered. Errors wrap [storage.ErrNotFound],
// [storage.ErrChanged] (InspectRemove found another version: the entry
// is returned as it is), [ErrCorrupt] or [ErrReply].
func EntryOf(key string, r Reply, withRecord bool) (storage.Entry, time.Time, error) {
	switch r.Kind {
	case Int:
		switch r.Int {
		case 0:
			return storage.Entry{}, time.Time{}, storage.ErrNotFound
		case codeCorrupt:
			return storage.Entry{}, time.Time{}, ErrCorrupt
		}
	case Array:
		v := r.Array
		if len(v) != 10 {
			break
		}
		tag, ok0 := v[0].str()
		fp, ok1 := v[1].str()
		since, ok2 := v[2].str()
		pttl, ok3 := v[3].code()
		sec, ok4 := v[4].str()
		usec, ok5 := v[5].str()
		size, ok6 := v[6].code()
		rec, ok7 := v[7].str()
		version, ok8 := v[8].str()
		removed, ok9 := v[9].code()
		if !(ok0 && ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7 && ok8 && ok9) || version == "" {
			break
		}
		secs, err1 := strconv.ParseInt(sec, 10, 64)
		usecs, err2 := strconv.ParseInt(usec, 10, 64)
		if err1 != nil || err2 != nil || (since != "" && len(since) != 6) {
			break
		}
		now := time.Unix(secs, usecs*1000)
		e := storage.Entry{Key: key, Fingerprint: fp, Since: stampTime(since), Version: version}
		if pttl >= 0 { // every entry has a TTL; -1 would be a key without one
			e.Expires = now.Add(time.Duration(pttl) * time.Millisecond)
		}
		switch tag {
		case "P":
			e.State, e.LeaseLeft = storage.InFlight, time.Duration(max(pttl, 0))*time.Millisecond
		case "D":
			e.State, e.Size = storage.Done, int(size)
			if withRecord {
				e.Record = []byte(rec)
			}
		case "I":
			e.State = storage.Issued
		default:
			return storage.Entry{}, time.Time{}, Unexpected(r)
		}
		if removed == 2 {
			return e, now, storage.ErrChanged
		}
		return e, now, nil
	}
	return storage.Entry{}, time.Time{}, Unexpected(r)
}

// doneResult parses the value of a done entry, as the acquire script
// returns it: 'C', the fingerprint's length, the fingerprint, the owner's
// length (a uvarint), the owner, the record; or 'D', the fingerprint's
// length, the fingerprint, the record; either after a stamp, but for 'D'.
// The fingerprint is a substring of v; the record is copied out of it.
func doneResult(v string) (storage.Result, error) {
	since, v, ok := cutStamp(v)
	if !ok || (since != "" && len(v) > 0 && v[0] == 'D') { // a 'D' entry is never stamped
		return storage.Result{}, unexpectedString()
	}
	if len(v) < 2 || (v[0] != 'C' && v[0] != 'D') || len(v) < 2+int(v[1]) {
		return storage.Result{}, unexpectedString()
	}
	n := 2 + int(v[1])
	fp, rest := v[2:n], v[n:]
	if v[0] == 'C' {
		m, k := uvarint(rest)
		if k <= 0 || m == 0 || uint64(len(rest)-k) < m {
			return storage.Result{}, unexpectedString()
		}
		rest = rest[k+int(m):]
	}
	return storage.Result{State: storage.Done, Fingerprint: fp, Record: []byte(rest)}, nil
}

// cutStamp splits a value into its stamp (the 6 bytes of a 'T' prefix;
// "" when it has none) and the entry after it. ok is false when v is too
// short for its stamp.
func cutStamp(v string) (since, e string, ok bool) {
	if len(v) == 0 || v[0] != 'T' {
		return "", v, true
	}
	if len(v) < 8 {
		return "", "", false
	}
	return v[1:7], v[7:], true
}

// stampTime reads the 6 bytes of a stamp: Unix milliseconds, most
// significant first. The zero Time for "" (no stamp).
func stampTime(since string) time.Time {
	if len(since) != 6 {
		return time.Time{}
	}
	var ms int64
	for i := range 6 {
		ms = ms<<8 | int64(since[i])
	}
	return time.UnixMilli(ms)
}

// uvarint reads the owner's length in a 'C' entry as the scripts do: a
// uvarint of at most 5 bytes. It returns the value and the bytes read, or
// k <= 0 when s does not start with one.
func uvarint(s string) (x uint64, k int) {
	for i := 0; i < len(s) && i < 5; i++ {
		b := s[i]
		x |= uint64(b&0x7f) << (7 * i)
		if b < 0x80 {
			return x, i + 1
		}
	}
	return 0, 0
}

// Unexpected describes a reply by its shape only, wrapping [ErrReply]: it
// may hold a record of a megabyte.
func Unexpected(r Reply) error {
	switch r.Kind {
	case Int:
		return fmt.Errorf("%w: an integer", ErrReply)
	case String:
		return unexpectedString()
	case Array:
		return fmt.Errorf("%w: an array of %d", ErrReply, len(r.Array))
	}
	return fmt.Errorf("%w: nil or a status", ErrReply)
}

func unexpectedString() error { return fmt.Errorf("%w: a string", ErrReply) }

// AppendStamp appends the stamp of an entry written at now: its Unix
// time in milliseconds, in 6 bytes, most significant first (the 'T' that
// precedes them in a value is not part of it). The scripts take it as an
// argument: an entry is stamped by the clock of the instance that wrote
// it, not by the server's (TIME would cost every script a command).
func AppendStamp(dst []byte, now time.Time) []byte {
	ms := now.UnixMilli()
	return append(dst, byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms))
}

// AppendProcessing appends the value of a new processing entry: the
// stamp of now, then 'P', the fingerprint's length, the fingerprint and
// the owner. A store's Acquire sends it as SET key value NX PX lease GET.
func AppendProcessing(dst []byte, now time.Time, fingerprint, owner string) []byte {
	dst = AppendStamp(append(dst, 'T'), now)
	dst = append(dst, 'P', byte(len(fingerprint)))
	return append(append(dst, fingerprint...), owner...)
}

// AppendUvarint appends x as an unsigned varint (7 bits a byte, least
// significant first, as encoding/binary's): the owner's length in a 'C'
// entry, which the Complete script takes as an argument.
func AppendUvarint(dst []byte, x uint64) []byte {
	for x >= 0x80 {
		dst = append(dst, byte(x)|0x80)
		x >>= 7
	}
	return append(dst, byte(x))
}

// Next says what a store does after the SET NX GET of an Acquire, when
// [SetResult] has no answer yet.
type Next uint8

const (
	// Answered: the result is the answer.
	Answered Next = iota
	// AskLeaseLeft: the key holds another owner's processing entry, and
	// the result says so; the store asks its PTTL and sets the result's
	// LeaseLeft from it with [LeaseLeft].
	AskLeaseLeft
	// RunAcquire: the key holds an issued entry, to be taken, or the
	// caller's own processing entry (a resent Acquire), whose lease is to
	// be renewed: the store runs the Acquire script, which does either
	// atomically (or whatever the entry now calls for), and answers as
	// [AcquireResult] reads its answer.
	RunAcquire
)

// SetResult maps the answer of an Acquire's SET NX GET for owner: found
// is false for a nil answer (there was no entry: the SET made one), and
// v is the value it found otherwise, which the SET left alone. A done
// entry is answered with its fingerprint (a substring of v) and a copy
// of its record; a processing entry of another owner is in flight (its
// lease left to ask, see [AskLeaseLeft]); an issued entry and the owner's
// own processing entry call for the Acquire script ([RunAcquire]). A
// value that is not an entry is [ErrCorrupt], as the scripts answer it.
func SetResult(v string, found bool, owner string) (storage.Result, Next, error) {
	if !found {
		return storage.Result{State: storage.Acquired}, Answered, nil
	}
	_, e, ok := cutStamp(v)
	if !ok || len(e) == 0 {
		return storage.Result{}, Answered, ErrCorrupt
	}
	switch e[0] {
	case 'C', 'D':
		res, err := doneResult(v)
		if err != nil {
			return storage.Result{}, Answered, ErrCorrupt
		}
		return res, Answered, nil
	case 'I':
		if !validTTL(e[1:]) {
			break
		}
		return storage.Result{}, RunAcquire, nil
	case 'P', 'Q':
		if len(e) < 2 || len(e) < 2+int(e[1]) {
			break
		}
		n := 2 + int(e[1])
		fp, rest := e[2:n], e[n:]
		if e[0] == 'Q' {
			if len(rest) == 0 || len(rest) < 2+int(rest[0]) || !validTTL(rest[1:1+int(rest[0])]) {
				break
			}
			rest = rest[1+int(rest[0]):]
		}
		if rest == "" {
			break
		}
		if rest == owner {
			return storage.Result{}, RunAcquire, nil
		}
		return storage.Result{State: storage.InFlight, Fingerprint: fp}, AskLeaseLeft, nil
	}
	return storage.Result{}, Answered, ErrCorrupt
}

// validTTL reports whether t is a TTL as an issued entry holds it: 1 to
// 15 decimal digits, without a leading zero.
func validTTL(t string) bool {
	if len(t) == 0 || len(t) > 15 || t[0] == '0' {
		return false
	}
	for i := range len(t) {
		if t[i] < '0' || t[i] > '9' {
			return false
		}
	}
	return true
}

// LeaseLeft is the lease left of an entry whose PTTL answered pttl (in
// ms): at least 1 ms, as the contract promises, also when the entry
// expired since it was read (-2) or in its last millisecond (0).
func LeaseLeft(pttl int64) time.Duration {
	return max(time.Duration(pttl)*time.Millisecond, time.Millisecond)
}
