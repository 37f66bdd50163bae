package httprec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
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
		2,          // version
		0,          // flags
		0xc9, 0x01, // status 201
		2,                    // header names
		1, 'A', 2, 1, '1', 0, // "A": "1", ""
		1, 'B', 1, 1, '2', // "B": "2"
		1,         // trailer names
		1, 'T', 0, // "T": no values
		2, 'h', 'i', // body
		0x4f, 0x04, 0x20, 0x38, // CRC-32C of the bytes above
	}
	if crc := crc32c(want[:len(want)-4]); binary.BigEndian.Uint32(want[len(want)-4:]) != crc {
		t.Fatalf("the test's checksum is wrong: CRC-32C is %#08x", crc)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("encoding\n got %v\nwant %v", got, want)
	}
	nr, _ := (&Record{NotReplayable: true}).MarshalBinary()
	if want := sealV2([]byte{1, 1, 0, 0, 0, 0}); !bytes.Equal(nr, want) {
		t.Errorf("not-replayable encoding %v, want %v", nr, want)
	}
}

// crc32c is a bit-at-a-time CRC-32C (Castagnoli, reflected polynomial
// 0x82f63b78), written out here so the tests do not check hash/crc32
// against itself.
func crc32c(b []byte) uint32 {
	c := ^uint32(0)
	for _, x := range b {
		c ^= uint32(x)
		for range 8 {
			if c&1 != 0 {
				c = c>>1 ^ 0x82f63b78
			} else {
				c >>= 1
			}
		}
	}
	return ^c
}

func TestCRC32C(t *testing.T) {
	t.Parallel()
	// The check value of CRC-32C (RFC 3720, B.4).
	if got := crc32c([]byte("123456789")); got != 0xe3069283 {
		t.Fatalf("crc32c(123456789) = %#08x, want 0xe3069283", got)
	}
}

// sealV2 turns bytes in the version 1 layout into version 2: version byte
// 2 and the checksum appended. Other bytes are sealed as they are, which
// gives structurally broken input a valid checksum. It uses hash/crc32,
// not crc32c, whose branch per bit would slow the fuzzer down under
// coverage instrumentation; TestRecordEncodingLayout holds both to the
// same value.
func sealV2(v1 []byte) []byte {
	b := bytes.Clone(v1)
	if len(b) > 0 && b[0] == version1 {
		b[0] = version2
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

// toV1 turns a version 2 encoding into the version 1 encoding of the same
// record, as an earlier release wrote it.
func toV1(v2 []byte) []byte {
	b := bytes.Clone(v2[:len(v2)-4])
	b[0] = version1
	return b
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
		{"version 2 without checksum", []byte{2, 0, 0xc8, 0x01, 0, 0, 0}},
		{"version 2 with a wrong checksum", []byte{2, 0, 0xc8, 0x01, 0, 0, 0, 0x12, 0x34, 0x56, 0x78}},
		{"version 2, checksum only", []byte{2, 0, 0x46, 0x99, 0x6a, 0x6e}},
		{"version 3", sealV2([]byte{3, 0, 0xc8, 0x01, 0, 0, 0})},
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
	// Every broken version 1 layout is as broken with a valid checksum.
	for _, tt := range tests[:len(tests):len(tests)] {
		if len(tt.data) > 0 && tt.data[0] == version1 {
			tests = append(tests, struct {
				name string
				data []byte
			}{tt.name + ", version 2", sealV2(tt.data)})
		}
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
			f := newFake()
			if status, err := ReplayBinary(f, tt.data); status != 0 || !errors.Is(err, ErrCorrupt) {
				t.Errorf("ReplayBinary = %d, %v, want 0, ErrCorrupt", status, err)
			}
			if len(f.headers) > 0 || len(f.h) > 0 || f.body.Len() > 0 {
				t.Errorf("ReplayBinary of a corrupt record wrote %v %v %q", f.headers, f.h, f.body.Bytes())
			}
		})
	}
}

// integrityRecord has headers, trailers and a body.
var integrityRecord = Record{
	Status: 201,
	Header: http.Header{
		"Content-Type": {"application/json"},
		"Location":     {"/orders/42"},
		"Trailer":      {"X-Checksum"},
		"Set-Cookie":   {"a=1", "b=2"},
	},
	Trailer: http.Header{"X-Checksum": {"abc"}, "X-Late": {"1"}},
	Body:    []byte(`{"id":42,"status":"created"}`),
}

// TestRecordEveryBitFlipIsCorrupt flips each bit of each byte of an
// encoded record, one at a time: every change is caught, by
// UnmarshalBinary and by ReplayBinary, which writes nothing at all.
func TestRecordEveryBitFlipIsCorrupt(t *testing.T) {
	t.Parallel()
	data, err := integrityRecord.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	for i := range len(data) {
		for bit := range 8 {
			flipped := bytes.Clone(data)
			flipped[i] ^= 1 << bit
			rec := Record{Status: 418}
			if err := rec.UnmarshalBinary(flipped); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("byte %d of %d, bit %d: UnmarshalBinary err %v, want ErrCorrupt (decoded %+v)", i, len(data), bit, err, rec)
			}
			rr := httptest.NewRecorder()
			rr.Code = 0 // WriteHeader would set it
			status, err := ReplayBinary(rr, flipped)
			if status != 0 || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("byte %d of %d, bit %d: ReplayBinary = %d, %v, want 0, ErrCorrupt", i, len(data), bit, status, err)
			}
			if rr.Code != 0 || len(rr.Header()) > 0 || rr.Body.Len() > 0 || rr.Flushed {
				t.Fatalf("byte %d, bit %d: ReplayBinary wrote status %d, header %v, body %q", i, bit, rr.Code, rr.Header(), rr.Body)
			}
		}
	}
}

// goldenV1 is integrityRecord as the release before the checksum encoded
// it (version 1: no checksum, the body ends the record).
var goldenV1 = []byte("\x01\x00\xc9\x01\x04\fContent-Type\x01\x10application/json\bLocation\x01\n/orders/42" +
	"\nSet-Cookie\x02\x03a=1\x03b=2\aTrailer\x01\nX-Checksum" +
	"\x02\nX-Checksum\x01\x03abc\x06X-Late\x01\x011" +
	"\x1c{\"id\":42,\"status\":\"created\"}")

// TestRecordVersion1 checks that the records of the previous release
// still decode to the same Record and replay exactly as their version 2
// encoding does, and that re-encoding one gives version 2.
func TestRecordVersion1(t *testing.T) {
	t.Parallel()
	v2, err := integrityRecord.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if want := sealV2(goldenV1); !bytes.Equal(v2, want) {
		t.Fatalf("version 2 encoding\n got %q\nwant %q", v2, want)
	}
	var rec Record
	if err := rec.UnmarshalBinary(goldenV1); err != nil {
		t.Fatal(err)
	}
	if want := normalize(integrityRecord); !reflect.DeepEqual(rec, want) {
		t.Fatalf("decoded\n got %+v\nwant %+v", rec, want)
	}
	if cap(rec.Body) != len(rec.Body) {
		t.Error("Body's capacity reaches past the record")
	}
	if again, _ := rec.MarshalBinary(); !bytes.Equal(again, v2) {
		t.Errorf("re-encoding a version 1 record: %q, want version 2 %q", again, v2)
	}
	for _, tt := range codecCases {
		data, err := tt.rec.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var got Record
		if err := got.UnmarshalBinary(toV1(data)); err != nil || !reflect.DeepEqual(got, normalize(tt.rec)) {
			t.Errorf("%s: version 1 decodes to %+v, %v", tt.name, got, err)
		}
	}
	want, wantStatus, wantErr := replayOf(v2)
	got, gotStatus, gotErr := replayOf(goldenV1)
	if gotStatus != wantStatus || gotErr != wantErr || wantErr != nil {
		t.Fatalf("ReplayBinary: version 1 %d %v, version 2 %d %v", gotStatus, gotErr, wantStatus, wantErr)
	}
	if want.Code != got.Code || want.Body.String() != got.Body.String() {
		t.Fatalf("version 1 replays %d %q, version 2 %d %q", got.Code, got.Body, want.Code, want.Body)
	}
	if w, g := want.Result().Header, got.Result().Header; !sameHeader(w, g) {
		t.Fatalf("version 1 replays header %v, version 2 %v", g, w)
	}
	if w, g := want.Result().Trailer, got.Result().Trailer; !sameHeader(w, g) || len(g) != 2 {
		t.Fatalf("version 1 replays trailer %v, version 2 %v", g, w)
	}
	if got.Body.String() != string(integrityRecord.Body) {
		t.Fatalf("body %q", got.Body)
	}
}

// replayOf replays data with ReplayBinary into a new recorder.
func replayOf(data []byte) (*httptest.ResponseRecorder, int, error) {
	rr := httptest.NewRecorder()
	status, err := ReplayBinary(rr, data)
	return rr, status, err
}

// TestRecordBitFlips flips bits of valid encodings, version 2 and version
// 1 (every bit of the small ones, 2000 random ones of the others): decoding
// must never panic, and since every record has exactly one encoding of
// each version, whatever decodes must re-encode to the same bytes (in
// version 2). TestRecordEveryBitFlipIsCorrupt shows that nothing decodes
// in version 2.
func TestRecordBitFlips(t *testing.T) {
	t.Parallel()
	encodings := validEncodings(t)
	for _, data := range encodings[:len(encodings):len(encodings)] {
		encodings = append(encodings, toV1(data))
	}
	for _, data := range encodings {
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

// checkDecode decodes data; a failure must wrap ErrCorrupt, and
// ReplayBinary must then fail the same way without writing anything. A
// success must re-encode to exactly data, or for version 1 to the version
// 2 encoding of the same layout, and ReplayBinary must replay its status.
func checkDecode(t testing.TB, data []byte) {
	t.Helper()
	var rec Record
	err := rec.UnmarshalBinary(data)
	f := newFake()
	status, rerr := ReplayBinary(f, data)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("decode error %v does not wrap ErrCorrupt", err)
		}
		if status != 0 || !errors.Is(rerr, ErrCorrupt) {
			t.Fatalf("UnmarshalBinary: %v; ReplayBinary: %d, %v", err, status, rerr)
		}
		if len(f.headers) > 0 || len(f.h) > 0 || f.body.Len() > 0 {
			t.Fatalf("ReplayBinary of a corrupt record wrote %v %v %q", f.headers, f.h, f.body.Bytes())
		}
		return
	}
	if status != rec.Status || (rerr == ErrNotReplayable) != rec.NotReplayable || (rerr != nil && rerr != ErrNotReplayable) {
		t.Fatalf("decoded %+v; ReplayBinary: %d, %v", rec, status, rerr)
	}
	again, err := rec.MarshalBinary()
	if err != nil {
		t.Fatalf("re-encoding a decoded record: %v", err)
	}
	want := data
	if data[0] == version1 {
		want = sealV2(data)
	}
	if !bytes.Equal(again, want) {
		t.Fatalf("decoded %x, re-encoded to %x, want %x", data, again, want)
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
		t.Error("Body's capacity reaches past the body: an append would write into the checksum")
	}
	data[len(data)-1-4] = 'Y' // the body's last byte, before the checksum
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
	// The same claims behind a valid checksum, and a mismatching one.
	for _, in := range inputs[:len(inputs):len(inputs)] {
		inputs = append(inputs, sealV2(in))
	}
	inputs = append(inputs, append([]byte{version2}, bytes.Repeat([]byte{0xff}, 64<<10)...))
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
