package idemclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// roundTripFunc is a base RoundTripper made of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// reply builds a response to r with status and headers given as pairs.
func reply(r *http.Request, status int, kv ...string) *http.Response {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader("")), Request: r}
}

// The retry table, status by status.
func TestJudgeResponse(t *testing.T) {
	tr := New()
	for _, c := range []struct {
		status int
		kv     []string
		retry  bool
		after  time.Duration
	}{
		{200, nil, false, 0},
		{201, nil, false, 0},
		{204, nil, false, 0},
		{303, nil, false, 0},
		{400, nil, false, 0},
		{401, nil, false, 0},
		{404, nil, false, 0},
		{409, nil, false, 0}, // ErrNotReplayable, or the application's conflict
		{409, []string{"Retry-After", "3"}, true, 3 * time.Second}, // in flight
		{409, []string{"Retry-After", "soon"}, false, 0},
		{413, nil, false, 0},
		{422, nil, false, 0},
		{408, nil, true, 0},
		{425, nil, true, 0},
		{429, nil, true, 0},
		{429, []string{"Retry-After", "7"}, true, 7 * time.Second},
		{500, nil, true, 0},
		{501, nil, false, 0},
		{502, nil, true, 0},
		{503, []string{"Retry-After", "1"}, true, time.Second},
		{504, nil, true, 0},
		{505, nil, false, 0},
		{599, nil, true, 0},
		{600, nil, false, 0},
		{503, []string{"Idempotent-Replayed", "true"}, false, 0}, // a stored response is final
		{201, []string{"Idempotent-Replayed", "true"}, false, 0},
	} {
		resp := reply(nil, c.status, c.kv...)
		v := tr.judgeResponse(resp, isReplayed(resp))
		if v.retry != c.retry || v.retryAfter != c.after {
			t.Errorf("%d %v: retry %v after %v, want %v after %v", c.status, c.kv, v.retry, v.retryAfter, c.retry, c.after)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 3, 10, 0, 0, 0, time.UTC)
	tr := New()
	tr.now = func() time.Time { return now }
	for _, c := range []struct {
		v  string
		d  time.Duration
		ok bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"1", time.Second, true},
		{"120", 2 * time.Minute, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"99999999999999999999999", maxRetryAfter, true},
		{"86401", maxRetryAfter, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"Tue, 03 Nov 2026 10:00:30 GMT", 30 * time.Second, true},
		{"tomorrow", 0, false},
	} {
		var kv []string
		if c.v != "" {
			kv = []string{"Retry-After", c.v}
		}
		d, ok := tr.retryAfter(reply(nil, 503, kv...))
		if d != c.d || ok != c.ok {
			t.Errorf("Retry-After %q: %v %v, want %v %v", c.v, d, ok, c.d, c.ok)
		}
	}
}

// The backoff's ceiling doubles from base to max; a Retry-After gets up
// to a tenth more.
func TestWait(t *testing.T) {
	tr := New(WithBackoff(100*time.Millisecond, time.Second))
	tr.rand = func(max time.Duration) time.Duration { return max } // the ceiling
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := tr.wait(i+1, verdict{retry: true}); got != w*time.Millisecond {
			t.Errorf("after attempt %d: %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	if got := tr.wait(200, verdict{retry: true}); got != time.Second {
		t.Errorf("after attempt 200: %v, want the max", got)
	}
	if got := tr.wait(1, verdict{retry: true, retryAfter: 10 * time.Second}); got != 11*time.Second {
		t.Errorf("Retry-After 10 s: at most %v, want 11 s", got)
	}
	tr.rand = nil // the real one: within [0, ceiling]
	for i := 0; i < 1000; i++ {
		if got := tr.wait(3, verdict{retry: true}); got < 0 || got > 400*time.Millisecond {
			t.Fatalf("jittered wait %v outside [0, 400ms]", got)
		}
	}
}

func TestRetryableError(t *testing.T) {
	req, _ := http.NewRequest("POST", "http://x", nil)
	for _, c := range []struct {
		err   error
		retry bool
	}{
		{io.EOF, true},
		{io.ErrUnexpectedEOF, true},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{&net.DNSError{Err: "no such host", Name: "x", IsNotFound: true}, false},
		{&net.DNSError{Err: "server misbehaving", Name: "x", IsTemporary: true}, true},
		{http.ErrSchemeMismatch, false},
		{errors.New("http2: client connection lost"), true},
	} {
		if got := retryableError(req, c.err); got != c.retry {
			t.Errorf("%v: retry %v, want %v", c.err, got, c.retry)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if retryableError(req.WithContext(ctx), io.EOF) {
		t.Error("retried with the request's context ended")
	}
	ch := make(chan struct{})
	close(ch)
	r2 := req.Clone(context.Background())
	//lint:ignore SA1019 the deprecated Cancel channel is still honoured: tested.
	r2.Cancel = ch
	if retryableError(r2, io.EOF) {
		t.Error("retried with the request's Cancel closed")
	}
}

// GetBody failing before a retry: the response at hand is returned, its
// Result.Err wrapping ErrBodyNotRewindable and GetBody's error.
func TestGetBodyFails(t *testing.T) {
	n := 0
	tr := New(WithBase(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		n++
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		return reply(r, 503), nil
	})))
	useFakeTime(tr)
	errGone := errors.New("gone")
	req, _ := http.NewRequest("POST", "http://x/", strings.NewReader("{}"))
	req.GetBody = func() (io.ReadCloser, error) { return nil, errGone }
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	res, ok := ResultOf(resp)
	if !ok || res.Attempts != 1 || !errors.Is(res.Err, ErrBodyNotRewindable) || !errors.Is(res.Err, errGone) || n != 1 {
		t.Fatalf("result %+v after %d sends", res, n)
	}
}

// A body that fails to read while it is buffered: the request is not sent.
func TestBodyReadFails(t *testing.T) {
	sent := false
	tr := New(WithBase(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = true
		return reply(r, 201), nil
	})))
	errRead := errors.New("disk on fire")
	body := &closeRecorder{Reader: io.MultiReader(strings.NewReader("abc"), &failReader{errRead})}
	req, _ := http.NewRequest("POST", "http://x/", body)
	req.GetBody = nil
	if _, err := tr.RoundTrip(req); !errors.Is(err, errRead) || sent || !body.closed.Load() {
		t.Fatalf("got %v, sent %v, closed %v", err, sent, body.closed.Load())
	}
}

type failReader struct{ err error }

func (f *failReader) Read([]byte) (int, error) { return 0, f.err }

// A base that returns neither a response nor an error gets an error, and
// it is retried like a broken connection.
func TestBaseNilNil(t *testing.T) {
	tr := New(WithBase(roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, nil })), WithMaxAttempts(2))
	useFakeTime(tr)
	req, _ := http.NewRequest("POST", "http://x/", nil)
	if _, err := tr.RoundTrip(req); !errors.Is(err, errNilResponse) || !errors.Is(err, ErrAttemptsExhausted) {
		t.Fatalf("got %v", err)
	}
}

// A base that answers with a response whose Request is another one still
// lets ResultOf find the Result; a response of an unprotected request has
// none.
func TestResultOf(t *testing.T) {
	tr := New(WithBase(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return reply(nil, 201, "Idempotent-Replayed", "true"), nil
	})))
	req, _ := http.NewRequest("PATCH", "http://x/", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if res, ok := ResultOf(resp); !ok || !res.Replayed || res.Attempts != 1 || !uuidV4.MatchString(res.Key) {
		t.Fatalf("got %+v %v", res, ok)
	}
	if resp.Request.Header.Get("Idempotency-Key") == "" || req.Header.Get("Idempotency-Key") != "" {
		t.Fatal("the key is not on the sent request, or it is on the caller's")
	}
	if _, ok := ResultOf(&http.Response{Request: req}); ok {
		t.Fatal("a Result for a request the transport did not send")
	}
	if _, ok := ResultOf(nil); ok {
		t.Fatal("a Result for nil")
	}
}

// WithHeader names the header; Go's own resend needs Idempotency-Key or
// X-Idempotency-Key, so this one is the transport's only.
func TestWithHeader(t *testing.T) {
	var got http.Header
	tr := New(WithHeader("x-request-key"), WithBase(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		got = r.Header
		return reply(r, 201), nil
	})))
	req, _ := http.NewRequest("POST", "http://x/", nil)
	req.Header.Set("Accept", "application/json")
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if !uuidV4.MatchString(got.Get("X-Request-Key")) || got.Get("Idempotency-Key") != "" || got.Get("Accept") != "application/json" {
		t.Fatalf("sent headers %v", got)
	}
}

func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		k := NewKey()
		if !uuidV4.MatchString(k) || seen[k] {
			t.Fatalf("key %q: not a UUIDv4, or seen before", k)
		}
		seen[k] = true
	}
}

func TestOptionsPanic(t *testing.T) {
	for name, o := range map[string]Option{
		"WithHeader empty":          WithHeader(""),
		"WithHeader space":          WithHeader("Idempotency Key"),
		"WithMethods none":          WithMethods(),
		"WithMethods bad":           WithMethods("POST", "P OST"),
		"WithMaxAttempts 0":         WithMaxAttempts(0),
		"WithMaxElapsed negative":   WithMaxElapsed(-time.Second),
		"WithBackoff 0":             WithBackoff(0, time.Second),
		"WithBackoff max below":     WithBackoff(time.Second, time.Millisecond),
		"WithMaxBufferedBody below": WithMaxBufferedBody(-1),
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: New did not panic", name)
				}
			}()
			New(o)
		}()
	}
	// Valid edge values.
	New(WithMaxAttempts(1), WithMaxElapsed(0), WithBackoff(time.Millisecond, time.Millisecond), WithMaxBufferedBody(0), WithBase(nil))
}

func TestErrorTimeout(t *testing.T) {
	e := &Error{Reason: ErrAttemptsExhausted, Attempts: 2, Err: &net.OpError{Op: "read", Err: timeoutErr{}}}
	if !e.Timeout() || !errors.Is(e, ErrAttemptsExhausted) {
		t.Fatal("Timeout or Is")
	}
	if want := "idemclient: attempts exhausted after 2 attempt(s): read: i/o timeout"; e.Error() != want {
		t.Fatalf("Error() = %q, want %q", e.Error(), want)
	}
	if (&Error{Reason: ErrTimeExhausted, Attempts: 1, Err: io.EOF}).Timeout() {
		t.Fatal("EOF is no timeout")
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// A real wait ends with the context, or with the request's Cancel.
func TestSleep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := sleep(ctx, nil, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("ended context: %v", err)
	}
	ch := make(chan struct{})
	close(ch)
	if err := sleep(context.Background(), ch, time.Hour); err == nil {
		t.Fatal("closed Cancel: no error")
	}
	if err := sleep(context.Background(), nil, time.Microsecond); err != nil {
		t.Fatal(err)
	}
}

// Printing the context of a sent request does not show the key.
func TestContextStringHidesKey(t *testing.T) {
	var sent *http.Request
	tr := New(WithBase(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = r
		return reply(r, 201), nil
	})))
	type ctxKey struct{}
	ctx := context.WithValue(context.Background(), ctxKey{}, "v")
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://x/", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	res, _ := ResultOf(resp)
	if s := fmt.Sprint(sent.Context()); strings.Contains(s, res.Key) || !strings.Contains(s, "idemclient") {
		t.Fatalf("context prints as %q", s)
	}
}
