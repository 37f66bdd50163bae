package grpcidem_test

import (
	"bytes"
	"testing"

	"github.com/idemkit/idem/grpcidem"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// seedRecords are valid records: a response with metadata, one without,
// and a status with details.
func seedRecords() [][]byte {
	st, _ := status.New(codes.NotFound, "no such item").WithDetails(&errdetails.ErrorInfo{Reason: "NO_ITEM", Metadata: map[string]string{"a": "1", "b": "2"}})
	return [][]byte{
		grpcidem.EncodeResponseRecord("google.protobuf.StringValue", []byte("\n\x07order 1"),
			metadata.Pairs("x-order", "1", "x-trace-bin", "\x00\xff", "x-order", "2"), metadata.Pairs("x-ledger", "")),
		grpcidem.EncodeResponseRecord("google.protobuf.Empty", nil, nil, nil),
		grpcidem.EncodeStatusRecord(st.Proto(), nil, metadata.Pairs("x-why", "gone")),
	}
}

// TestRecordRoundTrip: each seed decodes and encodes to itself; a record
// cut short, with a byte more, or of another version is refused.
func TestRecordRoundTrip(t *testing.T) {
	for i, b := range seedRecords() {
		again, err := grpcidem.Reencode(b)
		if err != nil || !bytes.Equal(again, b) {
			t.Errorf("seed %d: %x, %v; want %x", i, again, err, b)
		}
		for n := range len(b) {
			if _, err := grpcidem.Reencode(b[:n]); err == nil {
				t.Errorf("seed %d cut to %d bytes: decoded", i, n)
			}
		}
		if _, err := grpcidem.Reencode(append(bytes.Clone(b), 0)); err == nil {
			t.Errorf("seed %d with a byte more: decoded", i)
		}
		other := bytes.Clone(b)
		other[0] = 2
		if _, err := grpcidem.Reencode(other); err == nil {
			t.Errorf("seed %d as version 2: decoded", i)
		}
	}
	// An OK status, unsorted metadata, an empty key, a non-minimal length:
	// each refused.
	for name, b := range map[string][]byte{
		"OK status":      {1, 1, 0, 0, 0},
		"unsorted":       {1, 0, 2, 1, 'b', 0, 1, 'a', 0, 0, 1, 'x', 0},
		"empty key":      {1, 0, 1, 0, 0, 0, 1, 'x', 0},
		"long varint":    {1, 0, 0, 0, 0x81, 0x00, 'x', 0},
		"bad type name":  {1, 0, 0, 0, 2, '.', '.', 0},
		"unknown kind":   {1, 7, 0, 0},
		"count too high": {1, 0, 0xff, 0x7f},
	} {
		if _, err := grpcidem.Reencode(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// FuzzDecodeRecord: the decoder never panics, and what it accepts encodes
// back to the same bytes: a record has one encoding.
func FuzzDecodeRecord(f *testing.F) {
	for _, b := range seedRecords() {
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		again, err := grpcidem.Reencode(b)
		if err == nil && !bytes.Equal(again, b) {
			t.Errorf("%x decoded, encodes to %x", b, again)
		}
	})
}
