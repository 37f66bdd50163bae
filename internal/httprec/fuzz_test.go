package httprec

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// FuzzUnmarshal decodes arbitrary bytes: decoding never panics, a failure
// wraps ErrCorrupt (and ReplayBinary fails alike, writing nothing), and
// whatever decodes re-encodes to the same bytes (version 2; a version 1
// record to its version 2 form) and decodes again to an equal Record. A
// mutated version 2 record almost never passes its checksum, so input in
// the version 1 layout is also decoded sealed as version 2 (checksum
// appended), which takes the fuzzer past the checksum into the parser.
// Seeds: testdata/fuzz/FuzzUnmarshal and the encodings of codecCases, in
// both versions.
func FuzzUnmarshal(f *testing.F) {
	for _, data := range validEncodings(f) {
		// Large seeds make the fuzzer's minimization crawl.
		if len(data) <= 512 {
			f.Add(data)
			f.Add(toV1(data))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecode(t, data)
		if len(data) > 0 && data[0] == version1 {
			checkDecode(t, sealV2(data))
		}
	})
}

// TestUnmarshalSeeds checks the seed corpus of FuzzUnmarshal: each seed
// named "*-v2" is a valid version 2 record that decodes as the version 1
// seed of the same name without "-v2" does, and the seeds named
// "*-v2-flipped-header" and "*-v2-truncated" are corrupt.
func TestUnmarshalSeeds(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("testdata", "fuzz", "FuzzUnmarshal")
	seed := func(name string) []byte {
		t.Helper()
		raw, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		header, value, _ := strings.Cut(strings.TrimSpace(string(raw)), "\n")
		q, ok := strings.CutPrefix(value, "[]byte(")
		q, ok2 := strings.CutSuffix(q, ")")
		data, err := strconv.Unquote(q)
		if header != "go test fuzz v1" || !ok || !ok2 || err != nil {
			t.Fatalf("%s is not a []byte seed: %q", name, raw)
		}
		return []byte(data)
	}
	names, err := filepath.Glob(filepath.Join(dir, "*-v2*"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no version 2 seeds: %v", err)
	}
	for _, path := range names {
		name := filepath.Base(path)
		var rec Record
		err := rec.UnmarshalBinary(seed(name))
		if strings.HasSuffix(name, "-v2-flipped-header") || strings.HasSuffix(name, "-v2-truncated") {
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("%s: err %v, want ErrCorrupt", name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		var v1 Record
		if err := v1.UnmarshalBinary(seed(strings.TrimSuffix(name, "-v2"))); err != nil || !reflect.DeepEqual(v1, rec) {
			t.Errorf("%s: version 1 seed decodes to %+v, %v; version 2 to %+v", name, v1, err, rec)
		}
	}
}

// FuzzRoundTrip builds a Record from arbitrary parts: names and values are
// split on "\n"; name i gets the values of field i of values split on "\x00",
// and names with an odd index go to the trailer. Encoding fails only for an
// invalid status; otherwise decoding gives back the same record, from the
// version 2 encoding and from its version 1 form.
func FuzzRoundTrip(f *testing.F) {
	f.Add(200, false, "Content-Type\nX-Multi", "application/json\x00a\nb", []byte(`{"id":1}`))
	f.Add(0, true, "", "", []byte(nil))
	f.Add(204, false, "\n\n", "\x00\x00", []byte{0})
	f.Add(1000, false, "A", "1", []byte("x"))
	f.Fuzz(func(t *testing.T, status int, notReplayable bool, names, values string, body []byte) {
		rec := Record{Status: status, NotReplayable: notReplayable, Body: body}
		fields := strings.Split(values, "\x00")
		for i, name := range strings.Split(names, "\n") {
			h := &rec.Header
			if i%2 == 1 {
				h = &rec.Trailer
			}
			if *h == nil {
				*h = http.Header{}
			}
			var vv []string
			if i < len(fields) && fields[i] != "" {
				vv = strings.Split(fields[i], "\n")
			}
			(*h)[name] = append((*h)[name], vv...)
		}
		data, err := rec.MarshalBinary()
		valid := (status >= 100 && status <= 999) || (status == 0 && notReplayable)
		if !valid {
			if err == nil {
				t.Fatalf("status %d (NotReplayable %v) was encoded", status, notReplayable)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		var got Record
		if err := got.UnmarshalBinary(data); err != nil {
			t.Fatalf("decoding an encoding: %v", err)
		}
		if want := normalize(rec); !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip\n got %#v\nwant %#v", got, want)
		}
		var v1 Record
		if err := v1.UnmarshalBinary(toV1(data)); err != nil || !reflect.DeepEqual(v1, got) {
			t.Fatalf("version 1 form decodes to %#v, %v", v1, err)
		}
		appended, _ := got.AppendBinary([]byte{7})
		if !bytes.Equal(appended[1:], data) {
			t.Fatal("AppendBinary of the decoded record differs")
		}
	})
}
