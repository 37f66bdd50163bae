package httprec

import (
	"bytes"
	"encoding"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/bits"
	"net/http"
	"slices"
)

// ErrCorrupt is wrapped by every error [Record.UnmarshalBinary] returns: the
// bytes are not a record this package wrote (truncated, an unknown version,
// a checksum mismatch, a length past the end, trailing bytes, a status
// outside 100..999, ...).
var ErrCorrupt = errors.New("response: corrupt record")

// Record is a response as the client received it.
//
// A zero-length Header, Trailer or Body is encoded the same whether it is nil
// or empty, and decodes as nil.
type Record struct {
	// Status is the final status: 101 or 200..999 from a [Capture] (never
	// an informational 1xx); the encoding accepts 100..999.
	Status int
	// Header holds the headers committed with the status, minus the omitted
	// ones. A name with no values is kept: a Content-Type key with no values
	// means the client received no Content-Type and net/http must not sniff
	// one on replay.
	Header http.Header
	// Trailer holds the trailer values after the handler returned, keyed by
	// the name the client received them under; nil if none.
	Trailer http.Header
	// Body is the body the client received.
	Body []byte
	// NotReplayable reports that the handler completed but its response
	// could not be kept (too large, hijacked, shorter than its declared
	// Content-Length). Header, Trailer and Body are then empty and Status is
	// the status the client got, 0 if unknown (hijacked).
	NotReplayable bool
}

var (
	_ encoding.BinaryAppender    = (*Record)(nil)
	_ encoding.BinaryMarshaler   = (*Record)(nil)
	_ encoding.BinaryUnmarshaler = (*Record)(nil)
)

// The encoding, version 2. uvarint is encoding/binary's unsigned varint, in
// its shortest form; a string is a uvarint length followed by its bytes.
//
//	version  byte     2
//	flags    byte     bit 0: NotReplayable; other bits zero
//	status   uvarint  100..999, or 0 with NotReplayable
//	header   uvarint count, then per name in ascending byte order:
//	         string name, uvarint value count, string values...
//	trailer  same layout as header
//	body     uvarint length, then exactly that many bytes
//	crc      4 bytes  big-endian CRC-32C (Castagnoli) of every byte before
//	                  it, ending the record
//
// The checksum is verified before anything after the version byte is
// read, so a record changed in the store (one flipped bit anywhere, or any
// burst of up to 32) is corrupt rather than replayed with a wrong header or
// body. It detects accidents, not tampering: anyone who can write the
// store can write a valid checksum.
//
// Version 1, written by the releases before the checksum, is the same
// layout with the version byte 1 and no crc: the body ends the record.
// Decoding still accepts it, because such records stay in the store for
// their TTL (24 hours by default) after an upgrade; a change in one of them
// is detected only when it breaks the layout. A version 2 record read as
// version 1 is always corrupt, as its body no longer ends the data.
//
// The package writes only version 2, and every record has exactly one
// version 2 encoding, so equal records give equal bytes.
const (
	version1          = 1
	version2          = 2
	crcLen            = 4
	flagNotReplayable = 1 << 0
	knownFlags        = flagNotReplayable
)

// castagnoli is the CRC-32C table; crc32 computes it with the CPU's CRC32
// instruction where there is one.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// validStatus reports whether the record's status can be encoded.
func (r *Record) validStatus() bool {
	return (r.Status >= 100 && r.Status <= 999) || (r.Status == 0 && r.NotReplayable)
}

// AppendBinary appends the record's encoding (version 2, with its
// checksum) to b and returns the extended buffer (it implements
// [encoding.BinaryAppender]). Header names are sorted, so the output
// depends only on the record's content. With enough capacity in b it does
// not allocate unless a header map has more than 32 names. It fails only
// when Status is outside 100..999 (0 is allowed with NotReplayable), and
// then returns b unchanged.
func (r *Record) AppendBinary(b []byte) ([]byte, error) {
	if !r.validStatus() {
		return b, fmt.Errorf("response: cannot encode a record with status %d", r.Status)
	}
	var flags byte
	if r.NotReplayable {
		flags |= flagNotReplayable
	}
	start := len(b)
	b = append(b, version2, flags)
	b = binary.AppendUvarint(b, uint64(r.Status))
	b = appendHeader(b, r.Header)
	b = appendHeader(b, r.Trailer)
	b = binary.AppendUvarint(b, uint64(len(r.Body)))
	b = append(b, r.Body...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli)), nil
}

// MarshalBinary returns the record's encoding in a buffer of exactly the
// right size. See [Record.AppendBinary].
func (r *Record) MarshalBinary() ([]byte, error) {
	return r.AppendBinary(make([]byte, 0, r.encodedLen()))
}

// encodedLen returns the length of the record's encoding.
func (r *Record) encodedLen() int {
	return 2 + uvarintLen(uint64(r.Status)) + headerLen(r.Header) + headerLen(r.Trailer) +
		uvarintLen(uint64(len(r.Body))) + len(r.Body) + crcLen
}

func uvarintLen(x uint64) int { return (bits.Len64(x|1) + 6) / 7 }

func stringLen(s string) int { return uvarintLen(uint64(len(s))) + len(s) }

func headerLen(h http.Header) int {
	n := uvarintLen(uint64(len(h)))
	for k, vv := range h {
		n += stringLen(k) + uvarintLen(uint64(len(vv)))
		for _, v := range vv {
			n += stringLen(v)
		}
	}
	return n
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendHeader(b []byte, h http.Header) []byte {
	b = binary.AppendUvarint(b, uint64(len(h)))
	if len(h) == 0 {
		return b
	}
	var small [32]string
	names := small[:0]
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		vv := h[k]
		b = appendString(b, k)
		b = binary.AppendUvarint(b, uint64(len(vv)))
		for _, v := range vv {
			b = appendString(b, v)
		}
	}
	return b
}

// UnmarshalBinary decodes a record written by [Record.MarshalBinary] or
// [Record.AppendBinary] into r: a version 2 record, whose checksum it
// verifies before reading anything past the version byte, or a version 1
// record written by an earlier release, which has no checksum.
//
// The decoded Body aliases data: it is not copied, so data must not be
// modified while the record is in use; its capacity ends with the body, so
// appending to it never writes into data. Header names and values are
// copied (all of them in one allocation). Malformed input, including a
// checksum mismatch, returns an error wrapping [ErrCorrupt] and leaves r
// unchanged; decoding never panics and allocates at most in proportion to
// len(data).
func (r *Record) UnmarshalBinary(data []byte) error {
	l, err := parseLayout(data)
	if err != nil {
		return err
	}
	// Second pass: build the maps over one copy of the header bytes.
	rec := Record{Status: l.status, NotReplayable: l.notReplayable}
	if l.hn+l.tn > 0 {
		strs := string(data[l.start:l.end])
		var values []string
		if l.hv+l.tv > 0 {
			values = make([]string, l.hv+l.tv)
		}
		b := builder{s: strs, base: l.start, d: decoder{data: data, off: l.start}, values: values}
		rec.Header = b.header(l.hn)
		rec.Trailer = b.header(l.tn)
	}
	if l.body < l.bodyEnd {
		rec.Body = data[l.body:l.bodyEnd:l.bodyEnd]
	}
	*r = rec
	return nil
}

// layout is where the parts of a valid encoding are.
type layout struct {
	status        int
	notReplayable bool
	start, end    int // the header and trailer sections: data[start:end]
	hn, hv        int // names and values in the header section
	tn, tv        int // names and values in the trailer section
	body, bodyEnd int // the body: data[body:bodyEnd]
}

// parseLayout checks the whole encoding, version 2 or 1, without allocating
// (unless it is corrupt) and says where its parts are. A version 2 record's
// checksum is verified first: nothing after its version byte is read, no
// length trusted, before it matches.
func parseLayout(data []byte) (layout, error) {
	d := decoder{data: data}
	if len(data) < 2 {
		return layout{}, d.corrupt("truncated")
	}
	switch data[0] {
	case version1:
	case version2:
		if len(data) < 2+crcLen {
			return layout{}, d.corrupt("truncated")
		}
		n := len(data) - crcLen
		if crc32.Checksum(data[:n], castagnoli) != binary.BigEndian.Uint32(data[n:]) {
			return layout{}, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
		}
		// The rest is the version 1 layout, ending before the checksum.
		d.data = data[:n]
	default:
		return layout{}, fmt.Errorf("%w: unknown version %d", ErrCorrupt, data[0])
	}
	flags := data[1]
	if flags&^knownFlags != 0 {
		return layout{}, fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, flags)
	}
	d.off = 2
	status := d.uvarint()
	if d.err != "" {
		return layout{}, d.corrupt(d.err)
	}
	notReplayable := flags&flagNotReplayable != 0
	if status > 999 || (status < 100 && !(status == 0 && notReplayable)) {
		return layout{}, fmt.Errorf("%w: status %d", ErrCorrupt, status)
	}

	// First pass: validate the two header sections and count their values.
	l := layout{status: int(status), notReplayable: notReplayable, start: d.off}
	l.hn, l.hv = d.scanHeader()
	l.tn, l.tv = d.scanHeader()
	l.end = d.off
	bodyLen := d.uvarint()
	if d.err != "" {
		return layout{}, d.corrupt(d.err)
	}
	if rest := d.remaining(); bodyLen != rest {
		if bodyLen > rest {
			return layout{}, d.corrupt("body length past the end")
		}
		return layout{}, d.corrupt("trailing bytes")
	}
	l.body, l.bodyEnd = d.off, len(d.data)
	return l, nil
}

// decoder reads the encoding. After the first problem it records err and
// every read returns zero.
type decoder struct {
	data []byte
	off  int
	err  string
}

func (d *decoder) corrupt(why string) error {
	return fmt.Errorf("%w: %s at byte %d", ErrCorrupt, why, d.off)
}

func (d *decoder) fail(why string) {
	if d.err == "" {
		d.err = why
	}
}

func (d *decoder) remaining() uint64 { return uint64(len(d.data) - d.off) }

// uvarint reads a uvarint in its shortest form.
func (d *decoder) uvarint() uint64 {
	if d.err != "" {
		return 0
	}
	v, n := binary.Uvarint(d.data[d.off:])
	switch {
	case n == 0:
		d.fail("truncated")
		return 0
	case n < 0 || n != uvarintLen(v):
		d.fail("bad varint")
		return 0
	}
	d.off += n
	return v
}

// str reads a string and returns its bounds in data.
func (d *decoder) str() (start, end int) {
	n := d.uvarint()
	if d.err != "" {
		return d.off, d.off
	}
	if n > d.remaining() {
		d.fail("length past the end")
		return d.off, d.off
	}
	start = d.off
	d.off += int(n)
	return start, d.off
}

// scanHeader validates a header section and returns its number of names and
// of values.
func (d *decoder) scanHeader() (names, values int) {
	n := d.uvarint()
	// Each name takes at least two bytes (its length and its value count).
	if n > d.remaining()/2 {
		d.fail("header count past the end")
		return 0, 0
	}
	var prev []byte
	for i := range int(n) {
		s, e := d.str()
		nv := d.uvarint()
		if d.err != "" {
			return 0, 0
		}
		name := d.data[s:e]
		if i > 0 && bytes.Compare(prev, name) >= 0 {
			d.fail("header names out of order")
			return 0, 0
		}
		prev = name
		// Each value takes at least one byte.
		if nv > d.remaining() {
			d.fail("value count past the end")
			return 0, 0
		}
		for range int(nv) {
			d.str()
		}
		if d.err != "" {
			return 0, 0
		}
		values += int(nv)
	}
	return int(n), values
}

// builder reads header sections that scanHeader has validated.
type builder struct {
	s      string // data[base:...] as a string
	base   int
	d      decoder
	values []string
}

func (b *builder) string() string {
	s, e := b.d.str()
	return b.s[s-b.base : e-b.base]
}

func (b *builder) header(n int) http.Header {
	b.d.uvarint() // the count, already known
	if n == 0 {
		return nil
	}
	h := make(http.Header, n)
	for range n {
		name, vv := b.entry()
		h[name] = vv
	}
	return h
}

// entry reads one name and its values, taken from b.values (nil when it
// has none).
func (b *builder) entry() (name string, vv []string) {
	name = b.string()
	nv := int(b.d.uvarint())
	if nv == 0 {
		return name, nil
	}
	vv = b.values[:nv:nv]
	b.values = b.values[nv:]
	for i := range vv {
		vv[i] = b.string()
	}
	return name, vv
}
