package response

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// normalize returns rec as decoding returns it: empty maps, value lists and
// bodies become nil.
func normalize(rec Record) Record {
	norm := func(h http.Header) http.Header {
		if len(h) == 0 {
			return nil
		}
		out := make(http.Header, len(h))
		for k, vv := range h {
			if len(vv) == 0 {
				vv = nil
			}
			out[k] = vv
		}
		return out
	}
	rec.Header = norm(rec.Header)
	rec.Trailer = norm(rec.Trailer)
	if len(rec.Body) == 0 {
		rec.Body = nil
	}
	return rec
}

func manyNames(n int) http.Header {
	h := make(http.Header, n)
	for i := range n {
		h[fmt.Sprintf("X-Name-%03d", i)] = []string{fmt.Sprint(i), "second"}
	}
	return h
}

var codecCases = []struct {
	name string
	rec  Record
}{
	{"minimal", Record{Status: 200}},
	{"empty header", Record{Status: 204, Header: http.Header{}}},
	{"nil trailer", Record{Status: 200, Header: http.Header{"A": {"1"}}, Trailer: nil}},
	{"empty trailer", Record{Status: 200, Header: http.Header{"A": {"1"}}, Trailer: http.Header{}}},
	{"name without values", Record{Status: 200, Header: http.Header{"Content-Type": nil, "X-Empty": {}}}},
	{"empty values", Record{Status: 200, Header: http.Header{"X": {"", "", "v"}}}},
	{"typical", Record{
		Status: 201,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/orders/42"},
			"Set-Cookie":   {"a=1", "b=2"},
			"Trailer":      {"X-Checksum"},
		},
		Trailer: http.Header{"X-Checksum": {"abc"}},
		Body:    []byte(`{"id":42}`),
	}},
	{"binary body", Record{Status: 200, Body: []byte{0, 1, 2, 0, 0xff, 0x80}}},
	{"big body", Record{Status: 200, Body: bytes.Repeat([]byte("0123456789"), 200_000)}},
	{"long value", Record{Status: 200, Header: http.Header{"X-Long": {strings.Repeat("v", 70_000)}}}},
	{"many names", Record{Status: 200, Header: manyNames(100), Trailer: manyNames(40)}},
	{"non-canonical and odd names", Record{Status: 200, Header: http.Header{"x-lower": {"1"}, "": {"empty name"}, "Ünï": {"ç"}}}},
	{"status 100", Record{Status: 100}},
	{"status 101", Record{Status: 101}},
	{"status 999", Record{Status: 999}},
	{"not replayable", Record{Status: 200, NotReplayable: true}},
	{"not replayable, status unknown", Record{NotReplayable: true}},
}

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tt := range codecCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			data, err := tt.rec.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			if len(data) != cap(data) || len(data) != tt.rec.encodedLen() {
				t.Errorf("MarshalBinary: len %d cap %d encodedLen %d", len(data), cap(data), tt.rec.encodedLen())
			}
			appended, err := tt.rec.AppendBinary([]byte("prefix"))
			if err != nil || !bytes.Equal(appended, append([]byte("prefix"), data...)) {
				t.Errorf("AppendBinary differs from MarshalBinary (err %v)", err)
			}
			var got Record
			if err := got.UnmarshalBinary(data); err != nil {
				t.Fatal(err)
			}
			if want := normalize(tt.rec); !reflect.DeepEqual(got, want) {
				t.Errorf("round trip\n got %+v\nwant %+v", got, want)
			}
			again, _ := got.MarshalBinary()
			if !bytes.Equal(again, data) {
				t.Error("re-encoding the decoded record gives other bytes")
			}
		})
	}
}

func TestRecordEncodingLayout(t *testing.T) {
	t.Parallel()
	rec := Record{
		Status:  201,
		Header:  http.Header{"B": {"2"}, "A": {"1", ""}},
		Trailer: http.Header{"T": nil},
		Body:    []byte("hi"),
	}
	got, err := rec.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{
		1,          // version
		0,          // flags
		0xc9, 0x01, // status 201
		2,                    // header names
		1, 'A', 2, 1, '1', 0, // "A": "1", ""
		1, 'B', 1, 1, '2', // "B": "2"
		1,         // trailer names
		1, 'T', 0, // "T": no values
		2, 'h', 'i', // body
	}
	if !bytes.Equal(got, want) {
		t.Errorf("encoding\n got %v\nwant %v", got, want)
	}
	nr, _ := (&Record{NotReplayable: true}).MarshalBinary()
	if want := []byte{1, 1, 0, 0, 0, 0}; !bytes.Equal(nr, want) {
		t.Errorf("not-replayable encoding %v, want %v", nr, want)
	}
}

func TestRecordDeterministic(t *testing.T) {
	t.Parallel()
	for _, n := range []int{3, 32, 33, 200} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			var first []byte
			for i := range 20 {
				// Build equal maps in a different insertion order each time.
				h := make(http.Header)
				for _, j := range rand.Perm(n) {
					h[fmt.Sprintf("X-%d", j)] = []string{"v", fmt.Sprint(j)}
				}
				rec := Record{Status: 200, Header: h, Trailer: http.Header{"T": {"t"}}, Body: []byte("b")}
				data, err := rec.MarshalBinary()
				if err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					first = data
				} else if !bytes.Equal(data, first) {
					t.Fatal("equal records encoded to different bytes")
				}
			}
		})
	}
}

func TestRecordEncodeInvalidStatus(t *testing.T) {
	t.Parallel()
	for _, rec := range []Record{{Status: 0}, {Status: 99}, {Status: 1000}, {Status: -1}, {Status: 1 << 40}, {Status: 99, NotReplayable: true}} {
		if _, err := rec.MarshalBinary(); err == nil {
			t.Errorf("MarshalBinary accepted status %d (NotReplayable %v)", rec.Status, rec.NotReplayable)
		}
		if b, err := rec.AppendBinary([]byte("x")); err == nil || string(b) != "x" {
			t.Errorf("AppendBinary with status %d = %q, %v", rec.Status, b, err)
		}
	}
}

// validEncodings returns the encodings of codecCases, without the big ones.
func validEncodings(t testing.TB) [][]byte {
	var out [][]byte
	for _, tt := range codecCases {
		data, err := tt.rec.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if len(data) < 4096 {
			out = append(out, data)
		}
	}
	return out
}

func TestRecordEveryTruncationIsCorrupt(t *testing.T) {
	t.Parallel()
	for _, data := range validEncodings(t) {
		for n := range len(data) {
			var rec Record
			if err := rec.UnmarshalBinary(data[:n]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("prefix %d of %d bytes (%x): err %v, want ErrCorrupt", n, len(data), data[:n], err)
			}
		}
		var rec Record
		if err := rec.UnmarshalBinary(append(data[:len(data):len(data)], 0)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("a trailing byte: err %v, want ErrCorrupt", err)
		}
	}
}

func TestRecordCorrupt(t *testing.T) {
	t.Parallel()
	uv := func(x uint64) []byte { return binary.AppendUvarint(nil, x) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	ok200 := []byte{1, 0, 0xc8, 0x01}
	tests := []struct {
		name string
		data []byte
	}{
		{"nil", nil},
		{"version 0", []byte{0, 0, 0xc8, 0x01, 0, 0, 0}},
		{"version 2", []byte{2, 0, 0xc8, 0x01, 0, 0, 0}},
		{"unknown flag", []byte{1, 2, 0xc8, 0x01, 0, 0, 0}},
		{"status 0 without NotReplayable", []byte{1, 0, 0, 0, 0, 0}},
		{"status 99", cat([]byte{1, 0}, uv(99), []byte{0, 0, 0})},
		{"status 99 with NotReplayable", cat([]byte{1, 1}, uv(99), []byte{0, 0, 0})},
		{"status 1000", cat([]byte{1, 0}, uv(1000), []byte{0, 0, 0})},
		{"status overflowing uint64", cat([]byte{1, 0}, bytes.Repeat([]byte{0xff}, 10), []byte{0x01, 0, 0, 0})},
		{"non-minimal status varint", []byte{1, 0, 0xc8, 0x81, 0x00, 0, 0, 0}},
		{"non-minimal zero count", cat(ok200, []byte{0x80, 0x00, 0, 0})},
		{"header count past the end", cat(ok200, uv(1<<62), []byte{0, 0})},
		{"header count just too big", cat(ok200, uv(3), []byte{1, 'A', 0, 1, 'B', 0})},
		{"value count past the end", cat(ok200, []byte{1, 1, 'A'}, uv(1<<40), []byte{0, 0})},
		{"name length past the end", cat(ok200, []byte{1}, uv(1<<50), []byte{'A', 0, 0, 0})},
		{"value length past the end", cat(ok200, []byte{1, 1, 'A', 1, 9, 'v', 0, 0})},
		{"duplicate names", cat(ok200, []byte{2, 1, 'A', 0, 1, 'A', 0, 0, 0})},
		{"names out of order", cat(ok200, []byte{2, 1, 'B', 0, 1, 'A', 0, 0, 0})},
		{"trailer names out of order", cat(ok200, []byte{0, 2, 1, 'b', 0, 1, 'a', 0, 0})},
		{"body length past the end", cat(ok200, []byte{0, 0, 5, 'a', 'b'})},
		{"body length short", cat(ok200, []byte{0, 0, 1, 'a', 'b'})},
		{"huge body length", cat(ok200, []byte{0, 0}, uv(1<<63))},
		{"missing body length", cat(ok200, []byte{0, 0})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := Record{Status: 418, Body: []byte("unchanged")}
			err := rec.UnmarshalBinary(tt.data)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err %v, want ErrCorrupt", err)
			}
			if rec.Status != 418 || string(rec.Body) != "unchanged" {
				t.Errorf("a failed decode changed the record: %+v", rec)
			}
		})
	}
}

// TestRecordBitFlips flips bits of valid encodings (every bit of the small
// ones, 2000 random ones of the others): decoding must never panic, and
// since every record has exactly one encoding, whatever decodes must
// re-encode to the same bytes.
func TestRecordBitFlips(t *testing.T) {
	t.Parallel()
	for _, data := range validEncodings(t) {
		flip := func(i int) {
			flipped := bytes.Clone(data)
			flipped[i/8] ^= 1 << (i % 8)
			checkDecode(t, flipped)
		}
		if len(data) <= 256 {
			for i := range len(data) * 8 {
				flip(i)
			}
			continue
		}
		for range 2000 {
			flip(rand.IntN(len(data) * 8))
		}
	}
}

// checkDecode decodes data; a failure must wrap ErrCorrupt, a success must
// re-encode to exactly data.
func checkDecode(t testing.TB, data []byte) {
	t.Helper()
	var rec Record
	if err := rec.UnmarshalBinary(data); err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("decode error %v does not wrap ErrCorrupt", err)
		}
		return
	}
	again, err := rec.MarshalBinary()
	if err != nil {
		t.Fatalf("re-encoding a decoded record: %v", err)
	}
	if !bytes.Equal(again, data) {
		t.Fatalf("decoded %x, re-encoded to %x", data, again)
	}
	var rec2 Record
	if err := rec2.UnmarshalBinary(again); err != nil || !reflect.DeepEqual(rec, rec2) {
		t.Fatalf("second decode: %v, %+v != %+v", err, rec2, rec)
	}
}

func TestRecordBodyAliasesData(t *testing.T) {
	t.Parallel()
	data, _ := (&Record{Status: 200, Header: http.Header{"A": {"1"}}, Body: []byte("body")}).MarshalBinary()
	var rec Record
	if err := rec.UnmarshalBinary(data); err != nil {
		t.Fatal(err)
	}
	if cap(rec.Body) != len(rec.Body) {
		t.Error("Body's capacity reaches past the record: an append would write into data")
	}
	data[len(data)-1] = 'Y'
	if string(rec.Body) != "bodY" {
		t.Errorf("Body %q does not alias data", rec.Body)
	}
	for i := range data {
		data[i] = 0
	}
	if rec.Header.Get("A") != "1" {
		t.Error("header strings alias data")
	}
}

func TestRecordAllocations(t *testing.T) {
	rec := codecCases[6].rec // typical
	buf := make([]byte, 0, 1024)
	if n := testing.AllocsPerRun(100, func() {
		buf, _ = rec.AppendBinary(buf[:0])
	}); n != 0 {
		t.Errorf("AppendBinary into a large enough buffer: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		buf, _ = rec.MarshalBinary()
	}); n != 1 {
		t.Errorf("MarshalBinary: %v allocations, want 1", n)
	}
	data, _ := rec.MarshalBinary()
	var got Record
	// One string for all names and values, one slice for the values, and
	// the two maps.
	if n := testing.AllocsPerRun(100, func() {
		if err := got.UnmarshalBinary(data); err != nil {
			t.Fatal(err)
		}
	}); n > 6 {
		t.Errorf("UnmarshalBinary: %v allocations, want at most 6", n)
	}
}

// TestRecordDecodeAllocationBound checks that inputs claiming huge counts or
// lengths are rejected before anything in proportion to the claim is
// allocated.
func TestRecordDecodeAllocationBound(t *testing.T) {
	head := []byte{1, 0, 0xc8, 0x01}
	pad := bytes.Repeat([]byte{0}, 64)
	inputs := [][]byte{
		append(binary.AppendUvarint(bytes.Clone(head), 1<<40), pad...),                    // header count
		append(binary.AppendUvarint(append(bytes.Clone(head), 1, 1, 'A'), 1<<40), pad...), // value count
		append(binary.AppendUvarint(append(bytes.Clone(head), 0, 0), 1<<60), pad...),      // body length
		append(binary.AppendUvarint(append(bytes.Clone(head), 1), 1<<60), pad...),         // name length
	}
	for i, data := range inputs {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range 100 {
			var rec Record
			if err := rec.UnmarshalBinary(data); err == nil {
				t.Fatalf("input %d accepted", i)
			}
		}
		runtime.ReadMemStats(&after)
		if per := (after.TotalAlloc - before.TotalAlloc) / 100; per > 1024 {
			t.Errorf("input %d: %d bytes allocated per rejected decode of %d bytes", i, per, len(data))
		}
	}
}
