package grpcidem

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// recordVersion is the first byte of every record this package writes;
// the package documentation describes the encoding.
const recordVersion = 1

// Kinds of record.
const (
	kindResponse = 0
	kindStatus   = 1
)

// record is what a protected call's execution answered.
type record struct {
	header, trailer metadata.MD
	// A response: its message's full name and its bytes (when decoded:
	// they share the decoded bytes), or the message itself, which
	// appendRecord marshals. Empty for a status.
	typeName protoreflect.FullName
	message  []byte
	response proto.Message
	// status is the error the handler returned, or nil for a response.
	status *spb.Status
}

// errRecord is what decodeRecord returns for bytes that are not a record.
var errRecord = errors.New("grpcidem: not a record of this version")

// errSize is what appendRecord returns when a message's marshalled size
// is not the size it announced.
var errSize = errors.New("grpcidem: a message marshalled to another size than its own")

// deterministic marshals messages the same way every time, map entries
// sorted.
var deterministic = proto.MarshalOptions{Deterministic: true}

// appendRecord appends r's encoding to b, growing it once.
func appendRecord(b []byte, r *record) ([]byte, error) {
	kind := byte(kindResponse)
	var m proto.Message // marshalled in place
	size := 2 + mdSize(r.header) + mdSize(r.trailer) + 2*binary.MaxVarintLen64 + len(r.typeName) + len(r.message)
	switch {
	case r.status != nil:
		kind, m = kindStatus, r.status
	case r.response != nil:
		m = r.response
	}
	n := 0
	if m != nil {
		n = deterministic.Size(m)
		size += n
	}
	b = slices.Grow(b, size)
	b = append(b, recordVersion, kind)
	b = appendMD(b, r.header)
	b = appendMD(b, r.trailer)
	if kind == kindResponse {
		b = appendString(b, string(r.typeName))
	}
	if m == nil {
		return appendBytes(b, r.message), nil
	}
	b = binary.AppendUvarint(b, uint64(n))
	at := len(b)
	b, err := deterministic.MarshalAppend(b, m)
	if err == nil && len(b)-at != n {
		err = errSize
	}
	return b, err
}

// mdSize returns an upper bound of the size of md's encoding.
func mdSize(md metadata.MD) int {
	n := binary.MaxVarintLen64
	for k, vs := range md {
		for _, v := range vs {
			n += 2*binary.MaxVarintLen64 + len(k) + len(v)
		}
	}
	return n
}

// appendMD appends md's pairs, sorted by key.
func appendMD(b []byte, md metadata.MD) []byte {
	var a [8]string
	keys := a[:0]
	n := 0
	for k, vs := range md {
		if len(vs) > 0 {
			keys = append(keys, k)
			n += len(vs)
		}
	}
	slices.Sort(keys)
	b = binary.AppendUvarint(b, uint64(n))
	for _, k := range keys {
		for _, v := range md[k] {
			b = appendString(b, k)
			b = appendString(b, v)
		}
	}
	return b
}

// appendBytes appends p, length first.
func appendBytes(b, p []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

// appendString appends s, length first.
func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeRecord decodes what appendRecord encodes. It refuses any other
// bytes with an error, and never panics: the store may hand it anything.
func decodeRecord(b []byte) (*record, error) {
	d := decoder{b: b}
	if d.byte() != recordVersion {
		return nil, errRecord
	}
	kind := d.byte()
	r := &record{header: d.md(), trailer: d.md()}
	switch kind {
	case kindResponse:
		r.typeName = protoreflect.FullName(d.str())
		r.message = d.bytes()
		if !d.failed && !r.typeName.IsValid() {
			d.failed = true
		}
	case kindStatus:
		st := d.bytes()
		if !d.failed {
			r.status = new(spb.Status)
			if proto.Unmarshal(st, r.status) != nil || r.status.GetCode() == 0 {
				d.failed = true
			} else if again, err := deterministic.Marshal(r.status); err != nil || !bytes.Equal(again, st) {
				d.failed = true // not as appendRecord writes it
			}
		}
	default:
		d.failed = true
	}
	if d.failed || len(d.b) != 0 {
		return nil, errRecord
	}
	return r, nil
}

// decoder reads a record's fields; once a read fails, every later one
// gives nothing and failed stays set.
type decoder struct {
	b       []byte
	failed  bool
	scratch [binary.MaxVarintLen64]byte
}

// byte reads one byte.
func (d *decoder) byte() byte {
	if d.failed || len(d.b) == 0 {
		d.failed = true
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// uvarint reads a varint that is at most max, in its shortest form.
func (d *decoder) uvarint(max int) int {
	if d.failed {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > uint64(max) || n != len(binary.AppendUvarint(d.scratch[:0], v)) {
		d.failed = true
		return 0
	}
	d.b = d.b[n:]
	return int(v)
}

// bytes reads a length and that many bytes, which it returns: a part of
// the decoded bytes.
func (d *decoder) bytes() []byte {
	n := d.uvarint(len(d.b))
	if d.failed || n > len(d.b) { // the length's own bytes are read now
		d.failed = true
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

// str reads a length and that many bytes, as a string.
func (d *decoder) str() string { return string(d.bytes()) }

// md reads metadata: pairs whose keys are non-empty and sorted.
func (d *decoder) md() metadata.MD {
	n := d.uvarint(len(d.b) / 2) // a pair takes two bytes at least
	if d.failed || n == 0 {
		return nil
	}
	md := make(metadata.MD)
	last := ""
	for range n {
		k, v := d.str(), d.str()
		if d.failed || k == "" || k < last {
			d.failed = true
			return nil
		}
		md[k] = append(md[k], v)
		last = k
	}
	return md
}
