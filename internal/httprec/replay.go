package httprec

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/idemkit/idem/response"
)

// ReplayedHeader is the response header [Replay] sets to "true":
// [response.ReplayedHeader].
const ReplayedHeader = response.ReplayedHeader

// ErrNotReplayable is returned by [Replay] for a record whose response was
// not kept ([Record.NotReplayable]).
var ErrNotReplayable = errors.New("response: record is not replayable")

// Replay writes a stored record to w: the record's headers (each replacing
// any values w's header map already has for that name, other names left as
// they are), [ReplayedHeader], the status, the body in one Write, and then
// the trailers. When the record has neither trailers nor a Trailer
// declaration and its status allows a body, Replay also sets Content-Length,
// so the client sees a complete, unchunked response.
//
// Trailers whose names the record's Trailer header declares are set under
// their own names after the body; the others under [http.TrailerPrefix],
// announced with an empty value before the status so that net/http chunks
// the body and always sends them.
//
// Replay returns [ErrNotReplayable] for a NotReplayable record and an error
// wrapping [ErrCorrupt] for a status outside 100..999, writing nothing in
// either case. Otherwise it returns the error of the body's Write.
func Replay(w http.ResponseWriter, rec *Record) error {
	if rec.NotReplayable {
		return ErrNotReplayable
	}
	if rec.Status < 100 || rec.Status > 999 {
		return fmt.Errorf("%w: status %d", ErrCorrupt, rec.Status)
	}
	h := w.Header()
	values := newValues(rec.Header)
	for k, vv := range rec.Header {
		h[k], values = cloneValues(vv, values)
	}
	h.Set(ReplayedHeader, "true")
	declared := rec.Header["Trailer"]
	for k := range rec.Trailer {
		if !declares(declared, k) {
			// Announce the undeclared trailer before the header goes out:
			// net/http then chunks the body and sends it after, even when
			// the body is short (see the package documentation).
			h[http.TrailerPrefix+k] = nil
		}
	}
	if len(declared) == 0 && len(rec.Trailer) == 0 && bodyAllowedForStatus(rec.Status) &&
		h.Get("Transfer-Encoding") == "" {
		h.Set("Content-Length", strconv.Itoa(len(rec.Body)))
	}
	w.WriteHeader(rec.Status)
	var err error
	if len(rec.Body) > 0 {
		_, err = w.Write(rec.Body)
	}
	if len(rec.Trailer) > 0 {
		values = newValues(rec.Trailer)
		for k, vv := range rec.Trailer {
			name := k
			if !declares(declared, k) {
				name = http.TrailerPrefix + k
			}
			h[name], values = cloneValues(vv, values)
		}
	}
	return err
}

// newValues returns a slice with room for all of h's values.
func newValues(h http.Header) []string {
	n := 0
	for _, vv := range h {
		n += len(vv)
	}
	if n == 0 {
		return nil
	}
	return make([]string, 0, n)
}

// cloneValues copies vv to the end of values and returns the copy, with its
// capacity capped so that appending to it never touches the next one, and the
// extended values. A nil vv stays nil.
func cloneValues(vv, values []string) (clone, rest []string) {
	if vv == nil {
		return nil, values
	}
	i := len(values)
	values = append(values, vv...)
	return values[i:len(values):len(values)], values
}

// ReplayBinary writes the record that data encodes (see
// [Record.AppendBinary]) to w, exactly as [Record.UnmarshalBinary] followed
// by [Replay] would, without building the Record: it allocates one string
// for all header names and values and one slice for the values, which the
// replayed header map then owns. Like UnmarshalBinary it accepts version 2
// records, whose checksum it verifies first, and the version 1 records
// of earlier releases, which have none.
//
// It checks the whole encoding before writing anything. It returns status
// 0 and an error wrapping [ErrCorrupt] for bytes that are not a record
// (including a checksum mismatch), and the record's status with
// [ErrNotReplayable] itself for a NotReplayable record; it writes nothing,
// not even to w's header map, in either case. Otherwise it returns the
// record's status and the error of the body's Write.
func ReplayBinary(w http.ResponseWriter, data []byte) (status int, err error) {
	l, err := parseLayout(data)
	if err != nil {
		return 0, err
	}
	if l.notReplayable {
		return l.status, ErrNotReplayable
	}
	body := data[l.body:l.bodyEnd]

	// One string holds the header bytes and the Content-Length digits.
	var digits [20]byte
	cl := strconv.AppendInt(digits[:0], int64(len(body)), 10)
	var sb strings.Builder
	sb.Grow(l.end - l.start + len(cl))
	sb.Write(data[l.start:l.end])
	sb.Write(cl)
	s := sb.String()
	b := builder{s: s, base: l.start, d: decoder{data: data, off: l.start}, values: make([]string, l.hv+l.tv+2)}

	h := w.Header()
	var declared []string
	b.d.uvarint() // the count of names, already known
	for range l.hn {
		name, vv := b.entry()
		h[name] = vv
		if name == "Trailer" {
			declared = vv
		}
	}
	vv := b.values[:1:1]
	b.values = b.values[1:]
	vv[0] = "true"
	h[ReplayedHeader] = vv
	trailers := b.d
	b.d.uvarint()
	for range l.tn { // announce the undeclared trailers; values come later
		name := b.string()
		for range b.d.uvarint() {
			b.d.str()
		}
		if !declares(declared, name) {
			h[http.TrailerPrefix+name] = nil
		}
	}
	if len(declared) == 0 && l.tn == 0 && bodyAllowedForStatus(l.status) && h.Get("Transfer-Encoding") == "" {
		vv := b.values[:1:1]
		b.values = b.values[1:]
		vv[0] = s[len(s)-len(cl):]
		h["Content-Length"] = vv
	}
	w.WriteHeader(l.status)
	if len(body) > 0 {
		_, err = w.Write(body)
	}
	if l.tn > 0 {
		b.d = trailers
		b.d.uvarint()
		for range l.tn {
			name, vv := b.entry()
			if !declares(declared, name) {
				name = http.TrailerPrefix + name
			}
			h[name] = vv
		}
	}
	return l.status, err
}
