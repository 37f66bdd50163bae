package response

import (
	"bytes"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// FuzzUnmarshal decodes arbitrary bytes: decoding never panics, a failure
// wraps ErrCorrupt, and whatever decodes re-encodes to the same bytes and
// decodes again to an equal Record. Seeds: testdata/fuzz/FuzzUnmarshal and
// the encodings of codecCases.
func FuzzUnmarshal(f *testing.F) {
	for _, data := range validEncodings(f) {
		// Large seeds make the fuzzer's minimization crawl.
		if len(data) <= 512 {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecode(t, data)
	})
}

// FuzzRoundTrip builds a Record from arbitrary parts: names and values are
// split on "\n"; name i gets the values of field i of values split on "\x00",
// and names with an odd index go to the trailer. Encoding fails only for an
// invalid status; otherwise decoding gives back the same record.
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
		appended, _ := got.AppendBinary([]byte{7})
		if !bytes.Equal(appended[1:], data) {
			t.Fatal("AppendBinary of the decoded record differs")
		}
	})
}
