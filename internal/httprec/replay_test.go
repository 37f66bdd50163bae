package httprec

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
)

func TestReplay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		before     http.Header // already in the writer's header map
		rec        Record
		wantHeader http.Header // after Replay, before the trailers are added
		wantBody   string
	}{
		{
			name: "headers replace, others stay",
			before: http.Header{
				"Content-Type":   {"text/html"},
				"X-Request-Id":   {"abc"},
				"Content-Length": {"999"},
			},
			rec: Record{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}}, Body: []byte(`{}`)},
			wantHeader: http.Header{
				"Content-Type":   {"application/json"},
				"X-Multi":        {"a", "b"},
				"X-Request-Id":   {"abc"},
				"Content-Length": {"2"},
				ReplayedHeader:   {"true"},
			},
			wantBody: "{}",
		},
		{
			name:       "empty body gets Content-Length 0",
			rec:        Record{Status: 200, Header: http.Header{"Content-Type": nil}},
			wantHeader: http.Header{"Content-Type": nil, "Content-Length": {"0"}, ReplayedHeader: {"true"}},
		},
		{
			name:       "204 gets no Content-Length",
			rec:        Record{Status: 204},
			wantHeader: http.Header{ReplayedHeader: {"true"}},
		},
		{
			name:       "304 gets no Content-Length",
			rec:        Record{Status: 304, Header: http.Header{"Etag": {`"v"`}}},
			wantHeader: http.Header{"Etag": {`"v"`}, ReplayedHeader: {"true"}},
		},
		{
			name:       "declared trailer without values: no Content-Length",
			rec:        Record{Status: 200, Header: http.Header{"Trailer": {"X-T"}}, Body: []byte("b")},
			wantHeader: http.Header{"Trailer": {"X-T"}, ReplayedHeader: {"true"}},
			wantBody:   "b",
		},
		{
			name: "trailers",
			rec: Record{
				Status:  200,
				Header:  http.Header{"Trailer": {"X-Declared"}},
				Trailer: http.Header{"X-Declared": {"d"}, "X-Undeclared": {"u"}},
				Body:    []byte("b"),
			},
			wantHeader: http.Header{
				"Trailer":                           {"X-Declared"},
				http.TrailerPrefix + "X-Undeclared": nil,
				ReplayedHeader:                      {"true"},
			},
			wantBody: "b",
		},
		{
			name:       "Transfer-Encoding already set: no Content-Length",
			before:     http.Header{"Transfer-Encoding": {"chunked"}},
			rec:        Record{Status: 200, Body: []byte("b")},
			wantHeader: http.Header{"Transfer-Encoding": {"chunked"}, ReplayedHeader: {"true"}},
			wantBody:   "b",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rr := httptest.NewRecorder()
			for k, vv := range tt.before {
				rr.Header()[k] = vv
			}
			if err := Replay(rr, &tt.rec); err != nil {
				t.Fatal(err)
			}
			res := rr.Result()
			if res.StatusCode != tt.rec.Status {
				t.Errorf("status %d, want %d", res.StatusCode, tt.rec.Status)
			}
			if !headerEqual(res.Header, tt.wantHeader) {
				t.Errorf("header\n got %#v\nwant %#v", res.Header, tt.wantHeader)
			}
			if rr.Body.String() != tt.wantBody {
				t.Errorf("body %q, want %q", rr.Body.String(), tt.wantBody)
			}
			// The trailers are in the live map, under the names net/http
			// sends them from.
			for k, vv := range tt.rec.Trailer {
				name := k
				if !declares(tt.rec.Header["Trailer"], k) {
					name = http.TrailerPrefix + k
				}
				if !slices.Equal(rr.Header()[name], vv) {
					t.Errorf("trailer %s = %q, want %q", name, rr.Header()[name], vv)
				}
			}
		})
	}
}

func TestReplayDoesNotShareValues(t *testing.T) {
	t.Parallel()
	rec := Record{
		Status:  200,
		Header:  http.Header{"X-A": make([]string, 1, 10)},
		Trailer: http.Header{"X-T": make([]string, 1, 10)},
	}
	rec.Header["X-A"][0] = "a"
	rec.Trailer["X-T"][0] = "t"
	rr := httptest.NewRecorder()
	if err := Replay(rr, &rec); err != nil {
		t.Fatal(err)
	}
	h := rr.Header()
	h.Add("X-A", "added")
	h[http.TrailerPrefix+"X-T"][0] = "changed"
	h["X-A"][0] = "changed"
	if rec.Header["X-A"][:2][1] == "added" || rec.Header["X-A"][0] != "a" || rec.Trailer["X-T"][0] != "t" {
		t.Error("Replay shares value slices with the record")
	}
}

// errWriter fails every Write.
type errWriter struct{ *fakeWriter }

var errWrite = errors.New("write failed")

func (errWriter) Write([]byte) (int, error) { return 0, errWrite }

func TestReplayErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		w    http.ResponseWriter
		rec  Record
		want error
		sent bool // something was written
	}{
		{"not replayable", newFake(), Record{Status: 200, NotReplayable: true}, ErrNotReplayable, false},
		{"status 0", newFake(), Record{}, ErrCorrupt, false},
		{"status 1000", newFake(), Record{Status: 1000}, ErrCorrupt, false},
		{"write error", errWriter{newFake()}, Record{Status: 200, Body: []byte("x")}, errWrite, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := Replay(tt.w, &tt.rec)
			if !errors.Is(err, tt.want) {
				t.Errorf("Replay = %v, want %v", err, tt.want)
			}
			var f *fakeWriter
			switch w := tt.w.(type) {
			case *fakeWriter:
				f = w
			case errWriter:
				f = w.fakeWriter
			}
			if sent := len(f.headers) > 0 || len(f.h) > 0; sent != tt.sent {
				t.Errorf("wrote something: %v, want %v (headers %v, map %v)", sent, tt.sent, f.headers, f.h)
			}
		})
	}
}

// TestReplayBinaryMatchesReplay: ReplayBinary writes exactly what
// UnmarshalBinary followed by Replay writes.
func TestReplayBinaryMatchesReplay(t *testing.T) {
	recs := map[string]Record{
		"plain":     {Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/o/1"}}, Body: []byte(`{"id":42,"status":"created"}`)},
		"empty":     {Status: 204, Header: http.Header{"X-A": {"1", "2"}, "Content-Type": nil}},
		"no header": {Status: 200, Body: []byte("x")},
		"trailers": {Status: 200, Header: http.Header{"Trailer": {"X-Sum"}, "Idempotent-Replayed": {"no"}},
			Trailer: http.Header{"X-Sum": {"abc"}, "X-Late": {"1", "2"}}, Body: []byte("body")},
		"not replayable": {Status: 201, NotReplayable: true},
	}
	for name, rec := range recs {
		t.Run(name, func(t *testing.T) {
			data, err := rec.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			var dec Record
			if err := dec.UnmarshalBinary(data); err != nil {
				t.Fatal(err)
			}
			want, got := httptest.NewRecorder(), httptest.NewRecorder()
			want.Header().Set("Transfer-Encoding", "")
			got.Header().Set("Transfer-Encoding", "")
			werr := Replay(want, &dec)
			status, gerr := ReplayBinary(got, data)
			if !errors.Is(gerr, werr) && gerr != werr {
				t.Fatalf("error %v, want %v", gerr, werr)
			}
			if status != rec.Status {
				t.Fatalf("status %d, want %d", status, rec.Status)
			}
			if want.Code != got.Code || want.Body.String() != got.Body.String() {
				t.Fatalf("got %d %q, want %d %q", got.Code, got.Body, want.Code, want.Body)
			}
			if w, g := want.Result().Header, got.Result().Header; !sameHeader(w, g) {
				t.Fatalf("header %v, want %v", g, w)
			}
			if w, g := want.Result().Trailer, got.Result().Trailer; !sameHeader(w, g) {
				t.Fatalf("trailer %v, want %v", g, w)
			}
		})
	}
	if status, err := ReplayBinary(httptest.NewRecorder(), []byte{1, 0, 0xff}); status != 0 || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt: %d %v", status, err)
	}
}

// sameHeader is headerEqual that also tells a name without values (nil)
// from one with an empty list.
func sameHeader(a, b http.Header) bool {
	if !headerEqual(a, b) {
		return false
	}
	for k, va := range a {
		if (va == nil) != (b[k] == nil) {
			return false
		}
	}
	return true
}
