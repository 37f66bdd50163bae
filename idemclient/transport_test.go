package idemclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// answer is what a test request got.
type answer struct {
	status int
	body   string
	res    Result
	ok     bool // ResultOf found a Result
	err    error
}

// send sends method to url with body through tr, under ctx (nil for a
// background context), and reads the whole answer.
func send(t *testing.T, tr http.RoundTripper, ctx context.Context, method, url, body string) answer {
	t.Helper()
	if ctx == nil {
		ctx = context.Background()
	}
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return do(t, tr, req)
}

func do(t *testing.T, tr http.RoundTripper, req *http.Request) answer {
	t.Helper()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	res, ok := ResultOf(resp)
	return answer{status: resp.StatusCode, body: string(b), res: res, ok: ok}
}

// created answers 201 with a JSON body numbering the runs, Content-Length
// set, and cuts the connection before the response when cut says so.
func created(runs *atomic.Int64, cut func(n int64) bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		b, _ := io.ReadAll(r.Body)
		if cut != nil && cut(n) {
			cutResponse(r)
		}
		out := fmt.Sprintf(`{"order":%d,"got":%q}`, n, b)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(out)))
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, out)
	}
}

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// A response cut after the server stored it: the retry, with the same key,
// gets the replay, and the handler ran once. The connection is fresh, so
// http.Transport does not resend by itself: this transport retries.
func TestCutAfterCommitRetriedGetsReplay(t *testing.T) {
	var runs atomic.Int64
	k := newKit(t, created(&runs, func(n int64) bool { return n == 1 }))
	base := newBase(t)
	base.DisableKeepAlives = true
	var hook hookLog
	tr := New(WithBase(base), WithAttemptHook(hook.add))
	ft := useFakeTime(tr)

	a := send(t, tr, nil, "POST", k.URL+"/orders", `{"item":"book"}`)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.status != 201 || a.body != `{"order":1,"got":"{\"item\":\"book\"}"}` {
		t.Fatalf("got %d %s, want the first run's 201", a.status, a.body)
	}
	if runs.Load() != 1 || k.requests.Load() != 2 {
		t.Fatalf("handler ran %d times for %d requests, want once for 2", runs.Load(), k.requests.Load())
	}
	if !a.ok || a.res.Attempts != 2 || !a.res.Replayed || a.res.Err != nil || !uuidV4.MatchString(a.res.Key) {
		t.Fatalf("result %+v (found %v), want 2 attempts, a replay and a UUIDv4 key", a.res, a.ok)
	}
	at := hook.all()
	if len(at) != 2 || at[0].Err == nil || !at[0].Retry || at[0].StatusCode != 0 ||
		at[1].StatusCode != 201 || !at[1].Replayed || at[1].Retry {
		t.Fatalf("attempts %+v, want an error then a replayed 201", at)
	}
	if w := ft.recorded(); len(w) != 1 || w[0] > DefaultBackoffBase || at[0].Wait != w[0] {
		t.Fatalf("waits %v (hook %v), want one backoff of at most %v", w, at[0].Wait, DefaultBackoffBase)
	}
}

// FACTS: http.Transport resends a POST carrying Idempotency-Key once by
// itself when a reused connection breaks before the response. The resend
// happens inside one attempt of this transport; with the key it cannot run
// the handler twice.
func TestGoResendOnReusedConnection(t *testing.T) {
	var runs atomic.Int64
	k := newKit(t, created(&runs, func(n int64) bool { return n == 2 }))
	tr := New(WithBase(newBase(t)))
	useFakeTime(tr)

	if a := send(t, tr, nil, "POST", k.URL+"/orders", `{"warm":1}`); a.err != nil || a.status != 201 {
		t.Fatalf("warm-up: %+v", a)
	}
	a := send(t, tr, nil, "POST", k.URL+"/orders", `{"item":"pen"}`) // on the idle connection, cut
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.status != 201 || !strings.Contains(a.body, `"order":2`) || !a.res.Replayed {
		t.Fatalf("got %d %s %+v, want the replay of run 2", a.status, a.body, a.res)
	}
	if runs.Load() != 2 || k.requests.Load() != 3 || k.conns.Load() != 2 {
		t.Fatalf("%d runs, %d requests on %d connections; want 2 runs (warm-up and one), 3 requests, 2 connections",
			runs.Load(), k.requests.Load(), k.conns.Load())
	}
	if a.res.Attempts != 1 {
		t.Fatalf("%d attempts, want 1: the resend was http.Transport's", a.res.Attempts)
	}
}

// The same resend while the first execution is still running: the server
// cut the reused connection mid-handler, http.Transport resends at once and
// gets 409 with Retry-After, this transport waits it out and gets the
// replay. One execution.
func TestGoResendWhileInFlight(t *testing.T) {
	var runs atomic.Int64
	release := make(chan struct{})
	k := newKit(t, func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 2 {
			connOf(r).Conn.Close() // the client sees its reused connection break
			<-release
		}
		w.Header().Set("Content-Length", "2")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "ok")
	})
	free := sync.OnceFunc(func() { close(release) })
	t.Cleanup(free)
	var hook hookLog
	tr := New(WithBase(newBase(t)), WithAttemptHook(hook.add))
	ft := useFakeTime(tr)
	ft.onWait = func(n int) {
		if n == 1 {
			free()
			k.waitExecuted(t) // the warm-up's
			k.waitExecuted(t)
		}
	}
	if a := send(t, tr, nil, "POST", k.URL+"/orders", `{"warm":1}`); a.err != nil || a.status != 201 {
		t.Fatalf("warm-up: %+v", a)
	}
	a := send(t, tr, nil, "POST", k.URL+"/orders", `{"item":"pen"}`)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.status != 201 || !a.res.Replayed || a.res.Attempts != 2 || runs.Load() != 2 || k.requests.Load() != 4 {
		t.Fatalf("got %d %+v after %d runs and %d requests, want a replayed 201 after 2 attempts, "+
			"2 runs (warm-up and one) and 4 requests (warm-up, first, resend, retry)",
			a.status, a.res, runs.Load(), k.requests.Load())
	}
	at := hook.all()[1:] // after the warm-up's
	if at[0].StatusCode != http.StatusConflict || at[0].Header.Get("Retry-After") != "1" {
		t.Fatalf("first attempt: %d Retry-After %q, want the 409 of the resend", at[0].StatusCode, at[0].Header.Get("Retry-After"))
	}
	if w := ft.recorded(); len(w) != 1 || w[0] < time.Second || w[0] > 1100*time.Millisecond {
		t.Fatalf("waits %v, want Retry-After (1 s) plus at most a tenth", w)
	}
}

// A burst of 409s while a slow first request runs: the transport waits
// Retry-After each time, then gets the replay.
func TestConflictWaitsRetryAfter(t *testing.T) {
	var runs atomic.Int64
	started, release := make(chan struct{}), make(chan struct{})
	k := newKit(t, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		close(started)
		<-release
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "order 1")
	})
	free := sync.OnceFunc(func() { close(release) })
	t.Cleanup(free) // before the server closes, should the test fail
	first := background(k.URL+"/orders", "order-1")
	<-started

	var hook hookLog
	tr := New(WithBase(newBase(t)), WithAttemptHook(hook.add))
	ft := useFakeTime(tr)
	ft.onWait = func(n int) {
		if n == 3 {
			free()
			k.waitExecuted(t)
		}
	}
	a := send(t, tr, WithKey(context.Background(), "order-1"), "POST", k.URL+"/orders", `{}`)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.status != 201 || a.body != "order 1" || !a.res.Replayed || a.res.Attempts != 4 || a.res.Key != "order-1" {
		t.Fatalf("got %d %q %+v, want the replay after 4 attempts with key order-1", a.status, a.body, a.res)
	}
	if f := <-first; f.status != 201 || f.body != "order 1" || runs.Load() != 1 {
		t.Fatalf("first request got %d %q, handler ran %d times", f.status, f.body, runs.Load())
	}
	for i, w := range ft.recorded() {
		if w < time.Second || w > 1100*time.Millisecond {
			t.Fatalf("wait %d is %v, want Retry-After (1 s) plus at most a tenth", i+1, w)
		}
	}
	for i, at := range hook.all()[:3] {
		if at.StatusCode != http.StatusConflict || !at.Retry || at.N != i+1 {
			t.Fatalf("attempt %d: %+v, want a 409 retried", i+1, at)
		}
	}
}

// The store is down: 503 with Retry-After, then the request runs.
func TestStoreUnavailableWaitsThenSucceeds(t *testing.T) {
	var runs atomic.Int64
	k := newKit(t, created(&runs, nil))
	k.store.fail.Store(2)
	tr := New(WithBase(newBase(t)))
	ft := useFakeTime(tr)

	a := send(t, tr, nil, "POST", k.URL+"/orders", `{"item":"cup"}`)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.status != 201 || a.res.Replayed || a.res.Attempts != 3 || runs.Load() != 1 {
		t.Fatalf("got %d %+v after %d runs, want 201 at the third attempt, one run", a.status, a.res, runs.Load())
	}
	for _, w := range ft.recorded() {
		if w < time.Second || w > 1100*time.Millisecond {
			t.Fatalf("waits %v, want Retry-After (1 s) plus at most a tenth", ft.recorded())
		}
	}
}

// What the table says stop on is sent once.
func TestFinalAnswersNotRetried(t *testing.T) {
	var runs atomic.Int64
	k := newKit(t, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		switch r.URL.Query().Get("status") {
		case "large":
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, strings.Repeat("x", 64)) // over WithMaxResponseBody: not replayable
		case "":
			w.WriteHeader(http.StatusCreated)
		default:
			code, _ := strconv.Atoi(r.URL.Query().Get("status"))
			w.WriteHeader(code)
		}
	}, idem.WithMaxResponseBody(16))

	var hook hookLog
	tr := New(WithBase(newBase(t)), WithAttemptHook(hook.add))
	ft := useFakeTime(tr)
	keyed := func(key string) context.Context { return WithKey(context.Background(), key) }

	// Set up a used key and a completed request whose response was not kept.
	if a := send(t, tr, keyed("used"), "POST", k.URL+"/orders", `{"amount":1}`); a.status != 201 {
		t.Fatalf("setup: %+v", a)
	}
	if a := send(t, tr, keyed("large"), "POST", k.URL+"/orders?status=large", `{}`); a.status != 201 {
		t.Fatalf("setup: %+v", a)
	}

	long := strings.Repeat("k", 256)
	for _, c := range []struct {
		name   string
		ctx    context.Context
		header string
		query  string
		body   string
		want   int
	}{
		{"400 invalid key", nil, long, "", `{}`, 400},
		{"422 key reused with another body", keyed("used"), "", "", `{"amount":2}`, 422},
		{"409 not replayable", keyed("large"), "", "?status=large", `{}`, 409},
		{"404 from the handler", nil, "", "?status=404", `{}`, 404},
		{"403", nil, "", "?status=403", `{}`, 403},
		{"501", nil, "", "?status=501", `{}`, 501},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := c.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			req, _ := http.NewRequestWithContext(ctx, "POST", k.URL+"/orders"+c.query, strings.NewReader(c.body))
			req.Header.Set("Content-Type", "application/json")
			if c.header != "" {
				req.Header.Set("Idempotency-Key", c.header)
			}
			before, attempts := k.requests.Load(), len(hook.all())
			a := do(t, tr, req)
			if a.err != nil || a.status != c.want {
				t.Fatalf("got %d %v, want %d", a.status, a.err, c.want)
			}
			if a.res.Attempts != 1 || a.res.Err != nil || k.requests.Load()-before != 1 {
				t.Fatalf("result %+v, %d requests: want one attempt", a.res, k.requests.Load()-before)
			}
			at := hook.all()[attempts:]
			if len(at) != 1 || at[0].Retry || at[0].Stop != nil || at[0].StatusCode != c.want {
				t.Fatalf("hook saw %+v, want one final attempt", at)
			}
		})
	}
	if len(ft.recorded()) != 0 {
		t.Fatalf("waited %v", ft.recorded())
	}
}

// A 500 releases the key: the retry, with the same key, runs the handler
// again. When every attempt fails, the last response comes back with
// Result.Err.
func TestServerErrorRetriedWithSameKey(t *testing.T) {
	var keys record
	failures := atomic.Int64{}
	failures.Store(1)
	k := newKit(t, func(w http.ResponseWriter, r *http.Request) {
		info, _ := idem.FromContext(r.Context())
		keys.add(info.Key)
		if failures.Add(-1) >= 0 {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	tr := New(WithBase(newBase(t)))
	ft := useFakeTime(tr)

	req, _ := http.NewRequest("POST", k.URL+"/orders", strings.NewReader(`{}`))
	a := do(t, tr, req)
	if ks := keys.get(); a.status != 201 || a.res.Attempts != 2 || len(ks) != 2 || ks[0] != ks[1] || ks[0] != a.res.Key {
		t.Fatalf("got %d %+v, handler saw keys %q: want 201 on the second attempt, one key", a.status, a.res, ks)
	}
	if len(req.Header) != 0 {
		t.Fatalf("the caller's request was modified: %v", req.Header)
	}
	b := send(t, tr, nil, "POST", k.URL+"/orders", `{}`)
	if b.res.Key == a.res.Key || !uuidV4.MatchString(b.res.Key) {
		t.Fatalf("second logical request has key %q, first %q: want a new UUIDv4", b.res.Key, a.res.Key)
	}

	// Every attempt fails: 5 attempts, 4 backoffs, the last 500 returned.
	failures.Store(100)
	keys.reset()
	waits := len(ft.recorded())
	a = send(t, tr, nil, "POST", k.URL+"/orders", `{}`)
	if a.err != nil || a.status != 500 || a.res.Attempts != 5 || !errors.Is(a.res.Err, ErrAttemptsExhausted) {
		t.Fatalf("got %d %v %+v, want the fifth 500 with ErrAttemptsExhausted", a.status, a.err, a.res)
	}
	for i, k := range keys.get() {
		if k != a.res.Key {
			t.Fatalf("attempt %d carried key %q, want %q", i+1, k, a.res.Key)
		}
	}
	for i, w := range ft.recorded()[waits:] {
		if ceil := DefaultBackoffBase << i; w < 0 || w > ceil {
			t.Fatalf("backoff %d is %v, want at most %v", i+1, w, ceil)
		}
	}
}

// onlyReader hides a reader's other methods, so that http.NewRequest sets
// no GetBody.
type onlyReader struct{ io.Reader }

// A body without GetBody within the limit is buffered and sent again
// whole; over the limit it is streamed once and a retry is refused with
// ErrBodyNotRewindable.
func TestBodyWithoutGetBody(t *testing.T) {
	var bodies record
	var (
		fail atomic.Int64 // the next requests answered 500
		cut  atomic.Bool  // cut the next response after it is stored
	)
	k := newKit(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies.add(string(b))
		if fail.Add(-1) >= 0 {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		if cut.Swap(false) {
			cutResponse(r)
		}
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusCreated)
	})
	base := newBase(t)
	base.DisableKeepAlives = true // no resend by http.Transport itself
	tr := New(WithBase(base), WithMaxBufferedBody(32))
	useFakeTime(tr)
	post := func(body string) answer {
		bodies.reset()
		req, _ := http.NewRequest("POST", k.URL+"/orders", onlyReader{strings.NewReader(body)})
		if req.GetBody != nil {
			t.Fatal("the test's body has GetBody")
		}
		return do(t, tr, req)
	}
	small, large := strings.Repeat("s", 32), strings.Repeat("L", 100)

	fail.Store(1) // a 500, then 201
	if a, b := post(small), bodies.get(); a.status != 201 || a.res.Attempts != 2 || len(b) != 2 || b[0] != small || b[1] != small {
		t.Fatalf("small body: %d %+v, the server read %q", a.status, a.res, b)
	}
	fail.Store(1)
	a := post(large)
	if b := bodies.get(); a.status != 500 || a.res.Attempts != 1 || !errors.Is(a.res.Err, ErrBodyNotRewindable) || len(b) != 1 || b[0] != large {
		t.Fatalf("large body, 500: %d %+v, the server read %q; want the 500 with ErrBodyNotRewindable, the whole body once", a.status, a.res, b)
	}
	fail.Store(0)
	cut.Store(true) // the connection breaks after the response was stored
	a = post(large)
	var e *Error
	if b := bodies.get(); a.err == nil || !errors.Is(a.err, ErrBodyNotRewindable) || !errors.As(a.err, &e) || e.Attempts != 1 || len(b) != 1 || b[0] != large {
		t.Fatalf("large body, cut: %+v, the server read %q; want an *Error with ErrBodyNotRewindable after one attempt", a, b)
	}
	if strings.Contains(a.err.Error(), "-4") { // no key in the text (UUIDv4 keys have "-4")
		t.Fatalf("the error shows the key: %v", a.err)
	}

	// A body of unknown length is sent with its length once buffered; an
	// empty one as no body.
	req, _ := http.NewRequest("POST", k.URL+"/orders", onlyReader{strings.NewReader("")})
	if a := do(t, tr, req); a.status != 201 {
		t.Fatalf("empty body: %+v", a)
	}
}

// A key the caller gives (header or WithKey) is the one every attempt
// carries and the one the server reads.
func TestCallerKey(t *testing.T) {
	var seen record
	k := newKit(t, func(w http.ResponseWriter, r *http.Request) {
		info, _ := idem.FromContext(r.Context())
		seen.add(info.Key)
		w.WriteHeader(http.StatusCreated)
	})
	tr := New(WithBase(newBase(t)))
	useFakeTime(tr)
	last := seen.last

	req, _ := http.NewRequest("POST", k.URL+"/orders", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", `"sf-string"`)
	if a := do(t, tr, req); a.status != 201 || a.res.Key != `"sf-string"` || last() != "sf-string" {
		t.Fatalf("header key: %+v, server read %q", a, last())
	}
	for _, c := range []struct{ key, sent string }{
		{"order-42", "order-42"},
		{`"quoted" at start`, `"\"quoted\" at start"`},
		{" padded ", `" padded "`},
		{`back\slash`, `back\slash`},
	} {
		a := send(t, tr, WithKey(context.Background(), c.key), "POST", k.URL+"/orders", `{}`)
		if a.status != 201 || a.res.Key != c.sent || last() != c.key {
			t.Fatalf("WithKey(%q): %+v, server read %q; want it sent as %s", c.key, a, last(), c.sent)
		}
		// A second logical request under the same key: the replay.
		if a := send(t, tr, WithKey(context.Background(), c.key), "POST", k.URL+"/orders", `{}`); !a.res.Replayed {
			t.Fatalf("WithKey(%q) again: %+v, want the replay", c.key, a)
		}
	}
	// The header wins over WithKey.
	req, _ = http.NewRequestWithContext(WithKey(context.Background(), "ctx-key"), "POST", k.URL+"/orders", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "header-key")
	if a := do(t, tr, req); a.res.Key != "header-key" || last() != "header-key" {
		t.Fatalf("header and WithKey: %+v, server read %q", a, last())
	}

	n := k.requests.Load()
	for _, bad := range []string{"", strings.Repeat("k", 256), "tab\tkey", "é"} {
		body := &closeRecorder{Reader: strings.NewReader("{}")}
		req, _ := http.NewRequestWithContext(WithKey(context.Background(), bad), "POST", k.URL+"/orders", body)
		if a := do(t, tr, req); !errors.Is(a.err, ErrInvalidKey) || !body.closed.Load() {
			t.Fatalf("WithKey(%q): %+v, body closed %v; want ErrInvalidKey and the body closed", bad, a, body.closed.Load())
		}
	}
	if k.requests.Load() != n {
		t.Fatal("a request with an invalid key was sent")
	}
}

type closeRecorder struct {
	io.Reader
	closed atomic.Bool
}

func (c *closeRecorder) Close() error { c.closed.Store(true); return nil }

// The context's deadline bounds the waits: no attempt starts after it, and
// the last response comes back at once when Retry-After would pass it.
func TestContextDeadline(t *testing.T) {
	release, started := make(chan struct{}), make(chan struct{})
	var once sync.Once
	k := newKit(t, func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(started) })
		<-release
		w.WriteHeader(http.StatusCreated)
	})
	t.Cleanup(func() { close(release) }) // before the server closes
	background(k.URL+"/orders", "held")  // holds the key in flight until the test ends
	<-started

	var hook hookLog
	tr := New(WithBase(newBase(t)), WithAttemptHook(hook.add))
	ft := useFakeTime(tr)
	deadline := ft.start.Add(2500 * time.Millisecond) // fake time; the real deadline is as far
	ctx, cancel := context.WithDeadline(WithKey(context.Background(), "held"), deadline)
	defer cancel()

	a := send(t, tr, ctx, "POST", k.URL+"/orders", `{}`)
	if a.err != nil || a.status != http.StatusConflict || !errors.Is(a.res.Err, ErrTimeExhausted) || a.res.Attempts != 3 {
		t.Fatalf("got %d %v %+v, want the third 409 with ErrTimeExhausted", a.status, a.err, a.res)
	}
	var elapsed time.Duration
	for i, w := range ft.recorded() {
		elapsed += w
		if !ft.start.Add(elapsed).Before(deadline) {
			t.Fatalf("attempt %d started at +%v, after the deadline", i+2, elapsed)
		}
	}
	if at := hook.all(); !errors.Is(at[2].Stop, ErrTimeExhausted) || at[2].Retry {
		t.Fatalf("last attempt %+v, want Stop ErrTimeExhausted", at[2])
	}

	// WithMaxElapsed the same way, on real time: a Retry-After of a
	// minute (a server of the test's own says so: the kit's is 1 s) is
	// beyond 100 ms, so the 409 comes back at once, not a minute later
	// (however loaded the machine, well within 30 s).
	inFlight := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "60")
		w.WriteHeader(http.StatusConflict)
	}))
	t.Cleanup(inFlight.Close)
	tr2 := New(WithBase(newBase(t)), WithMaxElapsed(100*time.Millisecond))
	t0 := time.Now()
	a = send(t, tr2, WithKey(context.Background(), "held"), "POST", inFlight.URL+"/orders", `{}`)
	if a.status != http.StatusConflict || !errors.Is(a.res.Err, ErrTimeExhausted) || a.res.Attempts != 1 {
		t.Fatalf("WithMaxElapsed: %d %+v", a.status, a.res)
	}
	if d := time.Since(t0); d > 30*time.Second {
		t.Fatalf("WithMaxElapsed: returned after %v, want at once", d)
	}

	// The context ends during a wait: the wait ends with its error.
	ctx, cancel = context.WithCancel(WithKey(context.Background(), "held"))
	ft.onWait = func(int) { cancel() }
	if a := send(t, tr, ctx, "POST", k.URL+"/orders", `{}`); !errors.Is(a.err, context.Canceled) {
		t.Fatalf("canceled during the wait: %+v, want context.Canceled", a)
	}
	// A context already ended: the base's error, no retry.
	n := k.requests.Load()
	if a := send(t, tr, ctx, "POST", k.URL+"/orders", `{}`); !errors.Is(a.err, context.Canceled) || k.requests.Load() != n {
		t.Fatalf("canceled before: %+v", a)
	}
}

// The hook sees every attempt in order, with what follows it, and never
// the key.
func TestAttemptHook(t *testing.T) {
	var n atomic.Int64
	k := newKit(t, func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) {
		case 1:
			http.Error(w, "boom", http.StatusInternalServerError)
		case 2:
			w.Header().Set("Retry-After", "2")
			http.Error(w, "busy", http.StatusServiceUnavailable)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	})
	var hook hookLog
	tr := New(WithBase(newBase(t)), WithAttemptHook(hook.add))
	ft := useFakeTime(tr)
	a := send(t, tr, nil, "POST", k.URL+"/orders?x=1", `{}`)
	if a.status != 201 || a.res.Attempts != 3 {
		t.Fatalf("got %+v", a)
	}
	at, waits := hook.all(), ft.recorded()
	if len(at) != 3 || len(waits) != 2 {
		t.Fatalf("hook saw %d attempts and %d waits, want 3 and 2", len(at), len(waits))
	}
	for i, want := range []int{500, 503, 201} {
		x := at[i]
		if x.N != i+1 || x.StatusCode != want || x.Method != "POST" || x.URL.String() != k.URL+"/orders?x=1" ||
			x.Context == nil || x.Err != nil || x.Retry != (i < 2) || x.Stop != nil {
			t.Fatalf("attempt %d: %+v", i+1, x)
		}
		if i < 2 && x.Wait != waits[i] {
			t.Fatalf("attempt %d announced a wait of %v, waited %v", i+1, x.Wait, waits[i])
		}
		if s := fmt.Sprint(x.Header, x.Err, x.URL, x.Stop); strings.Contains(s, a.res.Key) {
			t.Fatalf("attempt %d shows the key: %s", i+1, s)
		}
	}
	if waits[1] < 2*time.Second || waits[1] > 2200*time.Millisecond {
		t.Fatalf("wait after the 503 is %v, want Retry-After 2 s plus at most a tenth", waits[1])
	}
}

// Methods outside the protected set pass through: no key, no retry, no
// Result.
func TestUnprotectedMethodsPassThrough(t *testing.T) {
	var keys record
	k := newKit(t, func(w http.ResponseWriter, r *http.Request) {
		keys.add(r.Header.Get("Idempotency-Key"))
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
	}, idem.WithMethods("POST", "PATCH", "PUT", "DELETE"))
	tr := New(WithBase(newBase(t)))
	ft := useFakeTime(tr)
	for _, m := range []string{"GET", "PUT", "DELETE"} {
		a := send(t, tr, nil, m, k.URL+"/any", "")
		if a.status != 503 || a.ok {
			t.Fatalf("%s: %+v, want the 503 and no Result", m, a)
		}
	}
	if ks := keys.get(); len(ks) != 3 || ks[0]+ks[1]+ks[2] != "" || len(ft.recorded()) != 0 {
		t.Fatalf("server saw keys %q, transport waited %v: want 3 requests without a key, no wait", ks, ft.recorded())
	}
	// WithMethods extends the set.
	tr = New(WithBase(newBase(t)), WithMethods("PUT"), WithMaxAttempts(2))
	useFakeTime(tr)
	if a := send(t, tr, nil, "PUT", k.URL+"/any", "{}"); a.res.Attempts != 2 || !uuidV4.MatchString(keys.last()) {
		t.Fatalf("PUT protected: %+v, last key %q", a.res, keys.last())
	}
	if a := send(t, tr, nil, "POST", k.URL+"/any", "{}"); a.ok {
		t.Fatalf("POST not in WithMethods(PUT): %+v", a)
	}
}

// A connection refused is retried up to the limit, then an *Error wraps
// ErrAttemptsExhausted and the dial error.
func TestConnectionErrorsRetried(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	var hook hookLog
	tr := New(WithBase(newBase(t)), WithMaxAttempts(3), WithAttemptHook(hook.add))
	ft := useFakeTime(tr)
	a := send(t, tr, nil, "POST", "http://"+addr+"/orders", `{}`)
	var e *Error
	var op *net.OpError
	if !errors.Is(a.err, ErrAttemptsExhausted) || !errors.As(a.err, &e) || e.Attempts != 3 || !errors.As(a.err, &op) {
		t.Fatalf("got %v, want an *Error after 3 attempts wrapping the dial error", a.err)
	}
	if len(ft.recorded()) != 2 || len(hook.all()) != 3 {
		t.Fatalf("%d waits, %d attempts", len(ft.recorded()), len(hook.all()))
	}
}

// A TLS certificate the client does not trust is not retried.
func TestCertificateErrorNotRetried(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake errors
	srv.StartTLS()
	defer srv.Close()
	tr := New(WithBase(newBase(t)))
	ft := useFakeTime(tr)
	a := send(t, tr, nil, "POST", srv.URL, `{}`)
	var (
		e    *Error
		cert *tls.CertificateVerificationError
	)
	if !errors.As(a.err, &cert) || errors.As(a.err, &e) || len(ft.recorded()) != 0 {
		t.Fatalf("got %v after %d waits, want the TLS error of the only attempt", a.err, len(ft.recorded()))
	}
}

// One Transport serves many goroutines: every request runs once with its
// own key.
func TestConcurrentRequests(t *testing.T) {
	var runs atomic.Int64
	k := newKit(t, created(&runs, nil))
	tr := New(WithBase(newBase(t)))
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		keys = map[string]bool{}
	)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				a := send(t, tr, nil, "POST", k.URL+"/orders", `{}`)
				if a.err != nil || a.status != 201 || a.res.Replayed {
					t.Errorf("got %+v", a)
					return
				}
				mu.Lock()
				keys[a.res.Key] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(keys) != 80 || runs.Load() != 80 {
		t.Fatalf("%d keys, %d runs, want 80 of each", len(keys), runs.Load())
	}
}
