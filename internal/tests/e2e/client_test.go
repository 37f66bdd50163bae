//go:build unix

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/internal/httprec"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The tests of this file send requests through the client half of the
// protocol, idemclient's Transport, to idemserver processes, and break
// things under it: the process is killed mid-request, the connection is
// cut after the server stored its record, duplicates arrive while the
// first request runs, the store's Redis goes away. Each checks what a user
// of the client sees (status, Idempotent-Replayed, body byte for byte,
// Result), what went over the wire (every attempt carried Result.Key, and
// waited the Retry-After it was told), and what the servers did: every
// execution in the count server, whatever key it ran under, and the
// record the store holds.
//
// IDEM_E2E_CLIENT=rotate-keys breaks the client on purpose: every attempt
// goes out under a new key, as a client that makes a key per attempt
// does; the tests must fail.

// clientBreak is IDEM_E2E_CLIENT: "rotate-keys", or "".
func clientBreak(t testing.TB) string {
	t.Helper()
	switch v := os.Getenv("IDEM_E2E_CLIENT"); v {
	case "":
		return ""
	case "rotate-keys":
		t.Logf("IDEM_E2E_CLIENT=%s: every attempt gets a new key", v)
		return v
	default:
		t.Fatalf("IDEM_E2E_CLIENT=%q: want rotate-keys or nothing", v)
		return ""
	}
}

// addr returns the server's host:port.
func (s *server) addr() string {
	return strings.TrimSuffix(strings.TrimPrefix(s.url, "http://"), "/orders")
}

// hop is where the front sends a connection, and whether it cuts it.
type hop struct {
	addr string
	cut  bool // forward the request, read the whole response, never pass it on
}

// front is a TCP proxy between the client and the idemserver processes,
// the one address the client knows, as a load balancer is: plan says
// where its n-th connection (from 1) goes, and whether it is cut after
// the response. A cut connection carries the request to the server,
// reads the server's whole response and resets the client's connection
// instead of passing it on: the server executed and answered, the client
// got nothing. A connection whose server dies (or cannot be dialed) is
// closed on the client too.
type front struct {
	ln   net.Listener
	url  string // http://host:port/orders
	plan func(n int) hop
	n    atomic.Int64

	mu     sync.Mutex
	conns  map[net.Conn]bool
	per    map[string]int // connections per server address
	cuts   []cutResponse
	closed bool
	wg     sync.WaitGroup
}

// cutResponse is a response a server sent on a cut connection.
type cutResponse struct {
	status int
	header http.Header
	body   []byte
}

func newFront(t testing.TB, plan func(n int) hop) *front {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &front{ln: ln, url: "http://" + ln.Addr().String() + "/orders", plan: plan,
		conns: map[net.Conn]bool{}, per: map[string]int{}}
	f.wg.Go(f.accept)
	t.Cleanup(f.close)
	return f
}

func (f *front) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		if !f.track(c) {
			c.Close()
			return
		}
		f.wg.Go(func() { f.serve(c) })
	}
}

// track adds c to the open connections, unless the front is closed.
func (f *front) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = true
	return true
}

func (f *front) untrack(cs ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range cs {
		delete(f.conns, c)
	}
}

func (f *front) serve(c net.Conn) {
	defer func() { c.Close(); f.untrack(c) }()
	h := f.plan(int(f.n.Add(1)))
	b, err := net.DialTimeout("tcp", h.addr, 5*time.Second)
	if err != nil {
		reset(c) // the server is gone: the client sees its connection broken
		return
	}
	if !f.track(b) {
		b.Close()
		return
	}
	defer func() { b.Close(); f.untrack(b) }()
	f.mu.Lock()
	f.per[h.addr]++
	f.mu.Unlock()

	up := make(chan struct{})
	go func() { // the client's bytes to the server
		defer close(up)
		io.Copy(b, c)
		b.Close()
	}()
	defer func() { <-up }()
	if !h.cut {
		io.Copy(c, b)
		c.Close()
		return
	}
	resp, err := http.ReadResponse(bufio.NewReader(b), nil)
	if err != nil {
		reset(c)
		return
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		reset(c)
		return
	}
	f.mu.Lock()
	f.cuts = append(f.cuts, cutResponse{status: resp.StatusCode, header: resp.Header, body: body})
	f.mu.Unlock()
	reset(c)
}

// reset closes c with a TCP reset.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// cutSoFar returns the responses cut so far.
func (f *front) cutSoFar() []cutResponse {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.cuts)
}

// perServer returns the number of connections each server got.
func (f *front) perServer() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.per))
	for k, v := range f.per {
		out[k] = v
	}
	return out
}

// close stops accepting, closes every connection and waits for the
// front's goroutines.
func (f *front) close() {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.ln.Close()
	f.wg.Wait()
}

// callLog is what the test saw of one call of the client (one logical
// request): every attempt as the hook reported it, and as it went out.
type callLog struct {
	name string // its X-Request-Id, the same on every attempt

	mu       sync.Mutex
	attempts []attemptSeen
	wire     []wireSeen
}

// attemptSeen is an attempt reported to WithAttemptHook, and when.
type attemptSeen struct {
	idemclient.Attempt
	at time.Time // the hook ran: the attempt had ended
}

// wireSeen is an attempt as the base RoundTripper got it.
type wireSeen struct {
	start time.Time
	key   string // the Idempotency-Key it carried
}

type callLogKey struct{}

func (cl *callLog) snapshot() ([]attemptSeen, []wireSeen) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return slices.Clone(cl.attempts), slices.Clone(cl.wire)
}

// statuses returns the outcome of every attempt so far: the status, or
// "error".
func (cl *callLog) statuses() []string {
	as, _ := cl.snapshot()
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = outcomeOf(a.Attempt)
	}
	return out
}

// count returns how many attempts so far answered status.
func (cl *callLog) count(status int) int {
	as, _ := cl.snapshot()
	n := 0
	for _, a := range as {
		if a.Err == nil && a.StatusCode == status {
			n++
		}
	}
	return n
}

func outcomeOf(a idemclient.Attempt) string {
	switch {
	case a.Err != nil:
		return "error"
	case a.Replayed:
		return strconv.Itoa(a.StatusCode) + " replayed"
	}
	return strconv.Itoa(a.StatusCode)
}

// idemClient is an http.Client over idemclient's Transport, whose attempts
// the test sees: the hook reports them, and a RoundTripper under the
// transport records each as it goes out. With IDEM_E2E_CLIENT=rotate-keys
// a RoundTripper between the two gives every attempt a new key.
type idemClient struct {
	hc *http.Client
}

func newIdemClient(t testing.TB, opts ...idemclient.Option) *idemClient {
	t.Helper()
	base := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
	t.Cleanup(base.CloseIdleConnections)
	var rt http.RoundTripper = wireRecorder{base}
	if clientBreak(t) == "rotate-keys" {
		rt = keyRotator{rt}
	}
	hook := func(a idemclient.Attempt) {
		if cl, ok := a.Context.Value(callLogKey{}).(*callLog); ok {
			cl.mu.Lock()
			cl.attempts = append(cl.attempts, attemptSeen{Attempt: a, at: time.Now()})
			cl.mu.Unlock()
		}
	}
	opts = append([]idemclient.Option{idemclient.WithBase(rt), idemclient.WithAttemptHook(hook)}, opts...)
	return &idemClient{hc: &http.Client{Transport: idemclient.New(opts...)}}
}

// wireRecorder records every attempt of a logged call as it goes out.
type wireRecorder struct{ next http.RoundTripper }

func (w wireRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	if cl, ok := r.Context().Value(callLogKey{}).(*callLog); ok {
		cl.mu.Lock()
		cl.wire = append(cl.wire, wireSeen{start: time.Now(), key: r.Header.Get("Idempotency-Key")})
		cl.mu.Unlock()
	}
	return w.next.RoundTrip(r)
}

// keyRotator is the client broken on purpose: a new key on every attempt.
type keyRotator struct{ next http.RoundTripper }

func (k keyRotator) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Idempotency-Key", idemclient.NewKey())
	return k.next.RoundTrip(r)
}

// orderBody is the body of every call: the same request, whichever call
// sends it.
const orderBody = `{"item":"book","amount":12}`

// clientAnswer is what one call of the client returned.
type clientAnswer struct {
	name   string
	status int
	header http.Header
	body   []byte
	res    idemclient.Result
	hasRes bool
	err    error
	start  time.Time
	end    time.Time
}

func (a *clientAnswer) String() string {
	if a.err != nil {
		return fmt.Sprintf("%s: %v", a.name, a.err)
	}
	return fmt.Sprintf("%s: %d replayed=%q X-Exec=%q Result{Attempts:%d Replayed:%t Err:%v} %q", a.name, a.status,
		a.header.Get("Idempotent-Replayed"), a.header.Get("X-Exec"), a.res.Attempts, a.res.Replayed, a.res.Err, a.body)
}

// post sends the order to url through the client, under key if not
// empty (idemclient.WithKey), else under the key the transport makes.
func (c *idemClient) post(ctx context.Context, url, key string, cl *callLog) *clientAnswer {
	a := &clientAnswer{name: cl.name, start: time.Now()}
	defer func() { a.end = time.Now() }()
	ctx = context.WithValue(ctx, callLogKey{}, cl)
	if key != "" {
		ctx = idemclient.WithKey(ctx, key)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(orderBody))
	if err != nil {
		a.err = err
		return a
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", cl.name)
	resp, err := c.hc.Do(req)
	if err != nil {
		a.err = err
		return a
	}
	defer resp.Body.Close()
	a.status, a.header = resp.StatusCode, resp.Header
	a.res, a.hasRes = idemclient.ResultOf(resp)
	a.body, a.err = io.ReadAll(resp.Body)
	return a
}

// calls runs calls of the client in the background and waits for them
// when the test ends (after ending their context).
type calls struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newCalls(t testing.TB, ctx context.Context) *calls {
	cs := &calls{}
	cs.ctx, cs.cancel = context.WithCancel(ctx)
	t.Cleanup(func() { cs.cancel(); cs.wg.Wait() })
	return cs
}

// start sends the order through c in the background; the answer comes on
// the channel.
func (cs *calls) start(c *idemClient, url, key string, cl *callLog) <-chan *clientAnswer {
	ch := make(chan *clientAnswer, 1)
	cs.wg.Go(func() { ch <- c.post(cs.ctx, url, key, cl) })
	return ch
}

// await waits for a call's answer, or fails the test at ctx's end.
func await(t testing.TB, ctx context.Context, ch <-chan *clientAnswer, cl *callLog) *clientAnswer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-ctx.Done():
		t.Fatalf("%s: no answer: %v; attempts so far: %v", cl.name, ctx.Err(), cl.statuses())
		return nil
	}
}

// checkCall checks what one call's user sees and what went over the wire:
// the answer is status (replayed or not), ResultOf agrees with the
// response and the attempts the hook saw, every attempt carried
// Result.Key, and every wait after a response with Retry-After lasted at
// least that (and at most a tenth more, the jitter), on the hook's word
// and on the wire's clock. It returns the attempts.
func checkCall(bad *failures, a *clientAnswer, cl *callLog, status int, replayed bool) []attemptSeen {
	as, wire := cl.snapshot()
	if a.err != nil || a.status != status || a.header.Get("Idempotent-Replayed") == "true" != replayed {
		bad.add("%v, want %d with replayed=%t; attempts %v", a, status, replayed, cl.statuses())
		return as
	}
	switch {
	case !a.hasRes:
		bad.add("%s: ResultOf found no Result", a.name)
	case a.res.Err != nil || a.res.Replayed != replayed || a.res.Attempts != len(as) || len(wire) != len(as):
		bad.add("%s: Result{Attempts:%d Replayed:%t Err:%v}, %d attempts hooked, %d sent; want Replayed=%t and no Err",
			a.name, a.res.Attempts, a.res.Replayed, a.res.Err, len(as), len(wire), replayed)
	}
	for i, w := range wire {
		if w.key != a.res.Key {
			bad.add("%s: attempt %d went out with another key than Result.Key (%d bytes against %d)", a.name, i+1, len(w.key), len(a.res.Key))
		}
	}
	for i, at := range as {
		if !at.Retry || at.Err != nil || i+1 >= len(wire) {
			continue
		}
		ra, ok := retryAfterOf(at.Header)
		if !ok {
			if at.StatusCode == http.StatusConflict || at.StatusCode == http.StatusServiceUnavailable {
				bad.add("%s: attempt %d answered %d without Retry-After", a.name, i+1, at.StatusCode)
			}
			continue
		}
		gap := wire[i+1].start.Sub(at.at)
		if at.Wait < ra || at.Wait > ra+ra/10 || gap < ra {
			bad.add("%s: attempt %d answered %d with Retry-After %v: the client meant to wait %v and sent attempt %d %v later",
				a.name, i+1, at.StatusCode, ra, at.Wait, i+2, gap)
		}
	}
	return as
}

// retryAfterOf parses a Retry-After of whole seconds.
func retryAfterOf(h http.Header) (time.Duration, bool) {
	v := h.Get("Retry-After")
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, false
	}
	return time.Duration(n) * time.Second, true
}

// retryAfters returns the Retry-After waits of a call's attempts that
// answered status, and the client's waits after them.
func retryAfters(as []attemptSeen, status int) (told, waited []time.Duration) {
	for _, a := range as {
		if a.Err == nil && a.StatusCode == status && a.Retry {
			if ra, ok := retryAfterOf(a.Header); ok {
				told = append(told, ra)
				waited = append(waited, a.Wait)
			}
		}
	}
	return told, waited
}

// allExecutions reads every execution the count server holds, under any
// key: a client that changed its key would show up here too.
func allExecutions(t testing.TB, ctx context.Context, rdb *redis.Client) (all []execution, byKey map[string][]execution) {
	t.Helper()
	var keys []string
	iter := rdb.Scan(ctx, 0, "exec:*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, strings.TrimPrefix(iter.Val(), "exec:"))
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	byKey = executions(t, ctx, rdb, keys)
	for _, k := range keys {
		all = append(all, byKey[k]...)
	}
	sortExecutions(all)
	return all, byKey
}

// doneRecords decodes every done record in a Redis store (after the
// stamp, 'C', the fingerprint's length, the fingerprint, the owner's
// length as a uvarint, the owner, the record; see redisstore).
func doneRecords(t testing.TB, ctx context.Context, rdb *redis.Client) []httprec.Record {
	t.Helper()
	var recs []httprec.Record
	iter := rdb.Scan(ctx, 0, "idem:*", 1000).Iterator()
	for iter.Next(ctx) {
		v, err := rdb.Get(ctx, iter.Val()).Bytes()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		v = unstamp(t, iter.Val(), v)
		if len(v) < 2 || v[0] != 'C' {
			continue
		}
		var rec httprec.Record
		n := 2 + int(v[1])
		if len(v) < n {
			t.Fatalf("%s: not a done record: %q", iter.Val(), v)
		}
		owner, m := binary.Uvarint(v[n:])
		if m <= 0 || uint64(len(v)-n-m) < owner || rec.UnmarshalBinary(v[n+m+int(owner):]) != nil {
			t.Fatalf("%s: not a done record: %q", iter.Val(), v)
		}
		recs = append(recs, rec)
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return recs
}

// sameAsStored reports whether the answer is the stored response: status,
// Content-Type, X-Exec and body byte for byte.
func sameAsStored(a *clientAnswer, status int, header http.Header, body []byte) bool {
	return a.err == nil && a.status == status && a.header.Get("Content-Type") == header.Get("Content-Type") &&
		a.header.Get("X-Exec") == header.Get("X-Exec") && bytes.Equal(a.body, body)
}

// checkStoredInRedis checks that the store holds exactly one done record
// and that a is it, byte for byte.
func checkStoredInRedis(t testing.TB, ctx context.Context, bad *failures, rdb *redis.Client, a *clientAnswer) {
	t.Helper()
	recs := doneRecords(t, ctx, rdb)
	if len(recs) != 1 {
		bad.add("the store holds %d done records, want 1", len(recs))
		return
	}
	if r := recs[0]; !sameAsStored(a, r.Status, r.Header, r.Body) {
		bad.add("%v differs from the stored response %d X-Exec=%q %q", a, r.Status, r.Header.Get("X-Exec"), r.Body)
	}
}

// checkReplayedDirect sends the order to srv once more, without
// idemclient, under key: the answer must be a replay of a, byte for byte
// (the memory store's record, which the test cannot read otherwise).
func checkReplayedDirect(t testing.TB, ctx context.Context, bad *failures, srv *server, key string, a *clientAnswer) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.url, strings.NewReader(orderBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Request-Id", "asked-again")
	resp, err := newClient(t).hc.Do(req)
	if err != nil {
		bad.add("asked again without the client: %v", err)
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.Header.Get("Idempotent-Replayed") != "true" || !sameAsStored(a, resp.StatusCode, resp.Header, body) {
		bad.add("asked again without the client: %d replayed=%q X-Exec=%q %q (%v), want a replay of %v",
			resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), resp.Header.Get("X-Exec"), body, err, a)
	}
}

// checkOneExecution checks that the servers ran the handler once in all,
// under key, in the process pid (0: any), and that a names it; it returns
// that execution.
func checkOneExecution(t testing.TB, ctx context.Context, bad *failures, counts *redis.Client, key string, pid int, a *clientAnswer) execution {
	t.Helper()
	all, byKey := allExecutions(t, ctx, counts)
	if len(all) != 1 {
		bad.add("%d executions in all, want 1: %v", len(all), all)
		if len(all) == 0 {
			return execution{}
		}
	}
	e := all[0]
	switch {
	case len(byKey[key]) != 1:
		bad.add("%d executions under the client's key, want 1; by key: %v", len(byKey[key]), byKey)
	case pid != 0 && e.pid != pid:
		bad.add("execution %v, want it in process %d", e, pid)
	case a.header.Get("X-Exec") != e.id():
		bad.add("%v does not name the execution %v", a, e)
	}
	return e
}

// TestClientServerKilled: the process running a request is killed
// (kill -9) and a new process, on the same Redis, takes over behind the
// same address (the front). The client's call ends with the response of
// the one execution there was, stored in Redis, byte for byte, after more
// than one attempt, all under one key.
//
//   - before-the-effect: the handler is held before it does anything
//     (before it counts its execution: -gate-at before-count). The killed
//     process never executed; its lease holds the key until it expires.
//     The client rides out the broken connection (and refused dials until
//     the new process listens) and the new process's 409s, waiting each
//     Retry-After; the new process runs the handler once the lease has
//     expired, never before: one execution, the new process's.
//   - after-the-record: the handler has run and the middleware has stored
//     its record, but the process is killed before net/http sends the
//     response (-gate-at after-store): the client got nothing. Its retry,
//     on the new process, gets the dead process's response replayed: one
//     execution, the killed process's.
//
// The memory store has no such test: its records die with the process.
func TestClientServerKilled(t *testing.T) {
	for _, tc := range []struct {
		name, gateAt string
		replayed     bool
	}{
		{"before-the-effect", "before-count", false},
		{"after-the-record", "after-store", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const lease = 2 * time.Second
			addr := redistest.Start(t)
			rdb := redisClient(t, addr)
			ctx := deadline(t, time.Minute)
			flags := []string{"-redis", addr, "-lease", lease.String()}
			a := startEach(t, append(slices.Clip(flags), "-gate-at", tc.gateAt))[0]
			a.control(t, "POST", "/gate/close")
			var target atomic.Pointer[string]
			aAddr := a.addr()
			target.Store(&aAddr)
			fr := newFront(t, func(int) hop { return hop{addr: *target.Load()} })
			c := newIdemClient(t, idemclient.WithMaxAttempts(60), idemclient.WithBackoff(20*time.Millisecond, 200*time.Millisecond))
			cs := newCalls(t, ctx)
			const key = "killed"
			cl := &callLog{name: "killed-call"}
			done := cs.start(c, fr.url, key, cl)

			waitFor(t, ctx, "the request to be held in the first process", func() bool { return a.held(t) == 1 })
			execs, _ := allExecutions(t, ctx, rdb)
			if want := map[bool]int{false: 0, true: 1}[tc.replayed]; len(execs) != want {
				t.Fatalf("%d executions while the request is held, want %d: %v", len(execs), want, execs)
			}
			if n := len(doneRecords(t, ctx, rdb)); n != len(execs) {
				t.Fatalf("%d records stored while the request is held, want %d", n, len(execs))
			}
			if st := cl.statuses(); len(st) != 0 {
				t.Fatalf("the client got answers while the request was held: %v", st)
			}

			// The lease left, as Redis counts it just before the kill: it
			// expires no earlier than read+pttl (a renewal in between only
			// puts it off; none comes after the kill). Read before the kill,
			// not after: a loaded machine could keep the test until the
			// lease has run out.
			var expiry time.Time
			if !tc.replayed {
				keys, err := rdb.Keys(ctx, "idem:*").Result()
				if err != nil || len(keys) != 1 {
					t.Fatalf("record keys %v (%v), want one lease", keys, err)
				}
				read := time.Now()
				pttl := rdb.PTTL(ctx, keys[0]).Val()
				if pttl <= 0 || pttl > lease {
					t.Fatalf("lease left before the kill %v, want in (0, %v]", pttl, lease)
				}
				expiry = read.Add(pttl)
			}
			a.kill()
			killed := time.Now()
			b := startEach(t, flags)[0]
			bAddr := b.addr()
			target.Store(&bAddr)
			up := time.Now()
			ans := await(t, ctx, done, cl)

			bad := failures{t: t}
			as := checkCall(&bad, ans, cl, http.StatusCreated, tc.replayed)
			if len(as) < 2 || as[0].Err == nil {
				bad.add("attempts %v: want the first to fail (its process was killed) and more to follow", cl.statuses())
			}
			checkStoredInRedis(t, ctx, &bad, rdb, ans)
			want := b.pid
			if tc.replayed {
				want = a.pid
			}
			e := checkOneExecution(t, ctx, &bad, rdb, ans.res.Key, want, ans)
			told, waited := retryAfters(as, http.StatusConflict)
			noVerdict := ""
			if !tc.replayed {
				// An attempt the new process answered before the lease
				// expired had to be a 409. A new process that answers
				// only after the lease expired (a slow start, or a slow
				// retry, on a loaded machine) has no 409 to give: the
				// test then did not see the client wait out the lease.
				var early int
				for _, a := range as {
					if a.Err == nil && a.StatusCode != http.StatusServiceUnavailable && a.at.Before(expiry) {
						early++
					}
				}
				switch {
				case len(told) > 0:
				case early > 0:
					bad.add("no attempt got 409 while the killed process's lease ran, though %d were answered before it expired: %v", early, cl.statuses())
				default:
					noVerdict = fmt.Sprintf("no attempt was answered before the killed process's lease expired, %v after the kill "+
						"(the new process listened %v after it): a loaded machine; no verdict on the client's wait for the lease",
						ms(expiry.Sub(killed)), ms(up.Sub(killed)))
				}
				if e.at.Before(expiry) {
					bad.add("the new process executed %v after the kill, before the lease expired (%v after it)",
						e.at.Sub(killed), expiry.Sub(killed))
				}
			}
			bad.report("after the kill")
			which := "by the killed process, replayed by the new one"
			if !tc.replayed {
				which = fmt.Sprintf("by the new process, %v after the kill; the lease expired %v after it",
					ms(e.at.Sub(killed)), ms(expiry.Sub(killed)))
			}
			figure(t, "lease %v, the process killed holding the request %s: the client ended %v after the kill "+
				"(the new process listened %v after it), %d replayed=%t after %d attempts %v; 409 Retry-After %v, waited %v; "+
				"1 execution, %s",
				lease, tc.gateAt, ms(ans.end.Sub(killed)), ms(up.Sub(killed)), ans.status, ans.res.Replayed,
				ans.res.Attempts, cl.statuses(), told, roundAll(waited), which)
			if noVerdict != "" {
				t.Skip(noVerdict)
			}
		})
	}
}

// span returns "min to max" of ds in milliseconds, for a figure.
func span(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	return ms(slices.Min(ds)) + " to " + ms(slices.Max(ds))
}

// roundAll rounds durations to milliseconds, for a figure.
func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// TestClientCutAfterCommit: the connection of the client's first attempt
// is cut after the server executed, stored its record and answered (the
// front reads the whole response and resets the client's connection
// instead). The client retries under the same key and gets the replay:
// Result.Replayed, the same bytes the execution sent on the cut
// connection, one execution. On the memory store the retry reaches the
// same process; on Redis it reaches another one.
func TestClientCutAfterCommit(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			addr := redistest.Start(t)
			rdb := redisClient(t, addr)
			ctx := deadline(t, time.Minute)
			var first, then *server
			if store == "memory" {
				first = startServers(t, 1, "-memory", "-redis", addr)[0]
				then = first
			} else {
				srvs := startServers(t, 2, "-redis", addr)
				first, then = srvs[0], srvs[1]
			}
			fr := newFront(t, func(n int) hop {
				if n == 1 {
					return hop{addr: first.addr(), cut: true}
				}
				return hop{addr: then.addr()}
			})
			c := newIdemClient(t, idemclient.WithBackoff(20*time.Millisecond, 200*time.Millisecond))
			cl := &callLog{name: "cut-call"}
			ans := c.post(ctx, fr.url, "", cl)

			bad := failures{t: t}
			checkCall(&bad, ans, cl, http.StatusCreated, true)
			if st := cl.statuses(); !slices.Equal(st, []string{"error", "201 replayed"}) {
				bad.add("attempts %v, want a broken connection, then the replay", st)
			}
			cuts := fr.cutSoFar()
			if len(cuts) != 1 {
				t.Fatalf("%d responses cut, want 1", len(cuts))
			}
			cut := cuts[0]
			if cut.status != http.StatusCreated || cut.header.Get("Idempotent-Replayed") != "" {
				bad.add("the cut response is %d replayed=%q, want the execution's 201", cut.status, cut.header.Get("Idempotent-Replayed"))
			}
			if !sameAsStored(ans, cut.status, cut.header, cut.body) {
				bad.add("%v differs from the response the execution sent on the cut connection: %d X-Exec=%q %q",
					ans, cut.status, cut.header.Get("X-Exec"), cut.body)
			}
			checkOneExecution(t, ctx, &bad, rdb, ans.res.Key, first.pid, ans)
			if store == "redis" {
				checkStoredInRedis(t, ctx, &bad, rdb, ans)
			} else if ans.err == nil {
				checkReplayedDirect(t, ctx, &bad, first, ans.res.Key, ans)
			}
			bad.report("after the cut")
			figure(t, "%s store: the first attempt's connection cut after the server's 201 (%d bytes of body), "+
				"the client ended after %d attempts %v in %v with Idempotent-Replayed %q and the same bytes; "+
				"1 execution; connections per server %v",
				store, len(cut.body), ans.res.Attempts, cl.statuses(), ms(ans.end.Sub(ans.start)),
				ans.header.Get("Idempotent-Replayed"), fr.perServer())
		})
	}
}

// TestClientConflictBurst: n calls of the client, each with the same key
// (idemclient.WithKey), while the first runs a slow handler (held at the
// gate until every other call has been told 409 twice). Every 409 carries
// Retry-After and every call waits it before trying again, under the same
// key; once the first is done, every call ends with its response, the
// others as replays, byte for byte: one execution. On the memory store
// one process; on Redis three, behind the front, which spreads the
// connections over them.
func TestClientConflictBurst(t *testing.T) {
	const n = 8
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			addr := redistest.Start(t)
			rdb := redisClient(t, addr)
			ctx := deadline(t, time.Minute)
			var srvs []*server
			if store == "memory" {
				srvs = startServers(t, 1, "-memory", "-redis", addr, "-lease", "10s")
			} else {
				srvs = startServers(t, 3, "-redis", addr, "-lease", "10s")
			}
			for _, s := range srvs {
				s.control(t, "POST", "/gate/close")
			}
			fr := newFront(t, func(i int) hop { return hop{addr: srvs[(i-1)%len(srvs)].addr()} })
			c := newIdemClient(t, idemclient.WithMaxAttempts(10))
			cs := newCalls(t, ctx)
			const key = "burst"
			logs := make([]*callLog, n)
			dones := make([]<-chan *clientAnswer, n)
			held := func() int {
				total := 0
				for _, s := range srvs {
					total += s.held(t)
				}
				return total
			}
			logs[0] = &callLog{name: "burst-0"}
			dones[0] = cs.start(c, fr.url, key, logs[0])
			waitFor(t, ctx, "the first call to run the handler", func() bool { return held() == 1 })
			begin := time.Now()
			for i := 1; i < n; i++ {
				logs[i] = &callLog{name: "burst-" + strconv.Itoa(i)}
				dones[i] = cs.start(c, fr.url, key, logs[i])
			}
			var checked time.Time
			waitFor(t, ctx, "every other call to be told 409 twice", func() bool {
				// A second handler held means a second execution: fail
				// now rather than at the deadline (asked every 100 ms,
				// not to load the machine).
				if time.Since(checked) >= 100*time.Millisecond {
					if h := held(); h != 1 {
						t.Fatalf("%d handlers held, want the first call's alone", h)
					}
					checked = time.Now()
				}
				for _, cl := range logs[1:] {
					if cl.count(http.StatusConflict) < 2 {
						return false
					}
				}
				return true
			})
			for _, s := range srvs {
				s.control(t, "POST", "/gate/open")
			}
			answers := make([]*clientAnswer, n)
			for i := range n {
				answers[i] = await(t, ctx, dones[i], logs[i])
			}
			elapsed := time.Since(begin)

			bad := failures{t: t}
			if checkCall(&bad, answers[0], logs[0], http.StatusCreated, false); answers[0].res.Attempts != 1 {
				bad.add("the first call took %d attempts %v, want 1", answers[0].res.Attempts, logs[0].statuses())
			}
			var told, waited []time.Duration
			var n409, minAttempts, maxAttempts int
			minAttempts = 1 << 30
			for i := 1; i < n; i++ {
				as := checkCall(&bad, answers[i], logs[i], http.StatusCreated, true)
				if !sameAsStored(answers[i], answers[0].status, answers[0].header, answers[0].body) {
					bad.add("%v differs from the first call's answer %v", answers[i], answers[0])
				}
				if answers[i].res.Key != answers[0].res.Key {
					bad.add("%s: Result.Key differs from the first call's", answers[i].name)
				}
				t409, w409 := retryAfters(as, http.StatusConflict)
				told, waited = append(told, t409...), append(waited, w409...)
				n409 += logs[i].count(http.StatusConflict)
				minAttempts, maxAttempts = min(minAttempts, len(as)), max(maxAttempts, len(as))
			}
			checkOneExecution(t, ctx, &bad, rdb, key, 0, answers[0])
			if store == "redis" {
				checkStoredInRedis(t, ctx, &bad, rdb, answers[0])
				if per := fr.perServer(); len(per) != len(srvs) {
					bad.add("connections per server %v: not every process served the burst", per)
				}
			} else if answers[0].err == nil {
				checkReplayedDirect(t, ctx, &bad, srvs[0], key, answers[0])
			}
			bad.report("after the burst")
			figure(t, "%s store, %d process(es), %d calls with one key while the first ran: %d answers 409, "+
				"Retry-After %s, the client waited %s; calls ended in %d to %d attempts, %v after the burst began, "+
				"%d replays byte for byte equal to the one execution; connections per server %v",
				store, len(srvs), n, n409, span(told), span(waited), minAttempts, maxAttempts, ms(elapsed), n-1, fr.perServer())
		})
	}
}

// TestClientRedisDown: the store's Redis is away while a call of the
// client is under way: killed (connections refused), or stopped with
// SIGSTOP (connections accepted, nothing answered). The client is told 503
// with Retry-After, waits it and tries again under the same key; once
// Redis is back the call succeeds: one execution, after Redis was back,
// its response stored. After a stop, Redis runs the acquires it had
// buffered when it continues: the key is locked by requests that were
// answered 503, for one lease, and the client waits out those 409s too.
func TestClientRedisDown(t *testing.T) {
	for _, how := range []string{"killed", "stopped"} {
		t.Run(how, func(t *testing.T) {
			const lease = 2 * time.Second
			store := redistest.StartProc(t)
			countAddr := redistest.Start(t)
			counts := redisClient(t, countAddr)
			ctx := deadline(t, time.Minute)
			srv := startServers(t, 1, "-redis", store.Addr(), "-count-redis", countAddr, "-lease", lease.String())[0]
			c := newIdemClient(t, idemclient.WithMaxAttempts(30))
			cs := newCalls(t, ctx)
			cl := &callLog{name: "down-call"}

			// A request first, so that the server's Redis client has a
			// connection in its pool, as a server that has been serving
			// has: the request of the stall is then sent, and Redis runs
			// it when it continues. Forgotten afterwards.
			storeRdb := redisClient(t, store.Addr())
			if r := newClient(t).post(ctx, []*server{srv}, 0, "warm-up", "warm-up", false); r.err != nil || r.status != http.StatusCreated {
				t.Fatalf("warm-up: %v", r)
			}
			if err := storeRdb.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if err := counts.Del(ctx, "exec:warm-up").Err(); err != nil {
				t.Fatal(err)
			}

			if how == "killed" {
				store.Kill()
			} else {
				store.Pause()
			}
			down := time.Now()
			done := cs.start(c, srv.url, "", cl)
			waitFor(t, ctx, "the client to be told 503 twice", func() bool {
				select {
				case a := <-done:
					t.Fatalf("the call ended while Redis was %s: %v; attempts %v", how, a, cl.statuses())
				default:
				}
				return cl.count(http.StatusServiceUnavailable) >= 2
			})
			resumed := time.Now() // no execution may start before
			// The attempts that ended before Redis was given back: each
			// was answered while it was away. (Counted after Restart or
			// Resume, it would count an attempt that Redis, back, let
			// succeed in between.)
			during := len(cl.statuses())
			if how == "killed" {
				store.Restart()
			} else {
				store.Resume()
			}
			back := time.Now()
			ans := await(t, ctx, done, cl)

			bad := failures{t: t}
			as := checkCall(&bad, ans, cl, http.StatusCreated, false)
			for i, a := range as[:min(during, len(as))] {
				if a.Err != nil || a.StatusCode != http.StatusServiceUnavailable {
					bad.add("attempt %d, while Redis was %s: %s, want 503", i+1, how, outcomeOf(a.Attempt))
				}
			}
			for i, a := range as {
				if a.Err != nil || a.StatusCode != http.StatusCreated && a.StatusCode != http.StatusServiceUnavailable &&
					(how == "killed" || a.StatusCode != http.StatusConflict) {
					bad.add("attempt %d: %s, want 503 until Redis is back (409 too, after a stop), then 201", i+1, outcomeOf(a.Attempt))
				}
			}
			e := checkOneExecution(t, ctx, &bad, counts, ans.res.Key, srv.pid, ans)
			if !e.at.IsZero() && e.at.Before(resumed) {
				bad.add("executed %v after Redis went away, before it was back (%v)", e.at.Sub(down), resumed.Sub(down))
			}
			checkStoredInRedis(t, ctx, &bad, storeRdb, ans)
			bad.report("after the outage")
			t503, w503 := retryAfters(as, http.StatusServiceUnavailable)
			t409, w409 := retryAfters(as, http.StatusConflict)
			figure(t, "Redis %s for %v: the client's attempts %v; 503 Retry-After %v, waited %v; 409 Retry-After %v, waited %v; "+
				"success %v after Redis was back, %d attempts in %v; 1 execution, %v after Redis was back",
				how, ms(back.Sub(down)), cl.statuses(), t503, roundAll(w503), t409, roundAll(w409),
				ms(ans.end.Sub(back)), ans.res.Attempts, ms(ans.end.Sub(ans.start)), ms(e.at.Sub(back)))
		})
	}
}
