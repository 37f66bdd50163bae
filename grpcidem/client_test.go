package grpcidem_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/grpcidem"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestClientThroughResetConnections: a proxy cuts the first two
// connections at the answer of their call (the request reached the
// server, the handler ran, the answer is lost: Unavailable); the
// interceptor retries with the same key on a new connection and gets the
// replay. The handler ran once.
func TestClientThroughResetConnections(t *testing.T) {
	for _, kind := range []string{"memory", "redis"} {
		t.Run(kind, func(t *testing.T) {
			e := start(t, setup{store: kind, network: "tcp", handler: func(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
				return wrapperspb.String("order created"), nil
			}})
			p := newCuttingProxy(t, e.addr, 2)
			var attempts []grpcidem.Attempt
			conn, err := grpc.NewClient("passthrough:///"+p.addr(),
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithChainUnaryInterceptor(grpcidem.UnaryClientInterceptor(
					grpcidem.WithBackoff(10*time.Millisecond, 50*time.Millisecond),
					grpcidem.WithAttemptHook(func(a grpcidem.Attempt) { attempts = append(attempts, a) }),
				)))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			var header metadata.MD
			var resp wrapperspb.StringValue
			err = conn.Invoke(testCtx(t), createMethod, order("book", 12), &resp, grpc.Header(&header))
			if err != nil || resp.GetValue() != "order created" || header.Get(grpcidem.ReplayedHeader)[0] != "true" {
				t.Fatalf("the call: %v, %v, header %v; want the replay", &resp, err, header)
			}
			if e.runs() != 1 {
				t.Errorf("the handler ran %d times, want 1", e.runs())
			}
			if len(attempts) < 3 || attempts[0].Code != codes.Unavailable || attempts[1].Code != codes.Unavailable {
				t.Errorf("attempts %v: want two Unavailable, then the replay", codesOf(attempts))
			}
			if n := p.cut.Load(); n != 2 {
				t.Errorf("the proxy cut %d connections, want 2", n)
			}
		})
	}
}

// codesOf lists the codes of attempts.
func codesOf(attempts []grpcidem.Attempt) []codes.Code {
	var cs []codes.Code
	for _, a := range attempts {
		cs = append(cs, a.Code)
	}
	return cs
}

// cuttingProxy forwards TCP connections to a gRPC server and closes the
// first n that carry an answer, both ways, when the server sends the
// HEADERS frame of the answer, before the client gets it.
type cuttingProxy struct {
	ln  net.Listener
	to  string
	n   int64
	cut atomic.Int64 // connections cut

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

// newCuttingProxy starts a proxy to addr that cuts the first n
// connections; it stops when the test ends.
func newCuttingProxy(t *testing.T, addr string, n int64) *cuttingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cuttingProxy{ln: ln, to: addr, n: n}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *cuttingProxy) addr() string { return p.ln.Addr().String() }

// accept serves connections until the listener closes.
func (p *cuttingProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.to)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() {
			io.Copy(s, c)
			s.Close()
			c.Close()
		})
		p.wg.Go(func() {
			p.frames(c, s)
			s.Close()
			c.Close()
		})
	}
}

// frames copies HTTP/2 frames from the server s to the client c until
// either ends, or until the first HEADERS frame of a stream (the answer
// of a call) while fewer than n connections were cut: it then returns
// without sending it.
func (p *cuttingProxy) frames(c, s net.Conn) {
	var head [9]byte
	for {
		if _, err := io.ReadFull(s, head[:]); err != nil {
			return
		}
		size := int(head[0])<<16 | int(head[1])<<8 | int(head[2])
		stream := binary.BigEndian.Uint32(head[5:]) & 0x7fffffff
		if head[3] == 0x1 && stream != 0 && p.cutOne() { // HEADERS of a call
			return
		}
		payload := make([]byte, size)
		if _, err := io.ReadFull(s, payload); err != nil {
			return
		}
		if _, err := c.Write(append(head[:], payload...)); err != nil {
			return
		}
	}
}

// cutOne counts one more connection cut, and reports true, while fewer
// than n were.
func (p *cuttingProxy) cutOne() bool {
	for {
		n := p.cut.Load()
		if n >= p.n {
			return false
		}
		if p.cut.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// close stops the proxy and waits for its goroutines.
func (p *cuttingProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// TestClientWaitsOutAborted: a call whose key is in flight gets Aborted
// with a RetryInfo; the interceptor waits that delay and then gets the
// first call's response, replayed, with the caller's own key.
func TestClientWaitsOutAborted(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{})
	var attempts []grpcidem.Attempt
	e := start(t, setup{store: "memory", network: "bufconn",
		handler: func(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
			close(entered)
			<-release
			return wrapperspb.String("order 1"), nil
		},
	})
	key := "wait-" + randomHex()
	first := make(chan answer, 1)
	go func() { first <- e.call(testCtx(t), createMethod, key, order("book", 12)) }()
	within(t, entered, "the handler")

	in := grpcidem.UnaryClientInterceptor(grpcidem.WithAttemptHook(func(a grpcidem.Attempt) {
		attempts = append(attempts, a)
		if a.N == 1 {
			close(release) // the first call finishes while the second waits
		}
	}))
	ctx := metadata.AppendToOutgoingContext(testCtx(t), grpcidem.DefaultKeyHeader, key)
	var header metadata.MD
	var raw rawMessage
	began := time.Now()
	invoke := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		return cc.Invoke(ctx, method, req, reply, opts...)
	}
	err := in(ctx, createMethod, order("book", 12), &raw, e.conn, invoke, grpc.Header(&header), grpc.ForceCodecV2(rawCodec{}))
	took := time.Since(began)
	a := within(t, first, "the first call")
	if err != nil || string(raw) != string(a.raw) || header.Get(grpcidem.ReplayedHeader)[0] != "true" {
		t.Fatalf("the second call: %v, header %v; want the first's response replayed", err, header)
	}
	if len(attempts) != 2 || attempts[0].Code != codes.Aborted || !attempts[0].Retry || !attempts[1].Replayed {
		t.Fatalf("attempts %v, want Aborted then the replay", codesOf(attempts))
	}
	delay := retryInfo(attempts[0].Err)
	if w := attempts[0].Wait; w < delay || w > delay+delay/10 || took < w {
		t.Errorf("waited %v (call %v) for a RetryInfo of %v: want the delay plus up to a tenth", w, took, delay)
	}
	if e.runs() != 1 {
		t.Errorf("the handler ran %d times", e.runs())
	}
}

// fakeServer is an invoker that answers each attempt with the next of
// its answers (the last one again once they run out), recording the key
// each attempt carried.
type fakeServer struct {
	header  string
	answers []fakeAnswer
	mu      sync.Mutex
	keys    [][]string
}

// fakeAnswer is one attempt's answer: an error (nil: OK) and header
// metadata.
type fakeAnswer struct {
	err    error
	header metadata.MD
}

func (f *fakeServer) invoke(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
	f.mu.Lock()
	h := f.header
	if h == "" {
		h = grpcidem.DefaultKeyHeader
	}
	f.keys = append(f.keys, metadata.ValueFromOutgoingContext(ctx, h))
	a := f.answers[min(len(f.keys), len(f.answers))-1]
	f.mu.Unlock()
	for _, o := range opts {
		if ho, ok := o.(grpc.HeaderCallOption); ok {
			*ho.HeaderAddr = a.header
		}
	}
	return a.err
}

// attempts returns how many attempts the fake server got.
func (f *fakeServer) attempts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.keys)
}

// fast is the backoff of the fake-server tests.
var fast = grpcidem.WithBackoff(time.Millisecond, 2*time.Millisecond)

// withDelay returns a status of code with a RetryInfo of d.
func withDelay(code codes.Code, d time.Duration) error {
	st, _ := status.New(code, code.String()).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	return st.Err()
}

// inFlight returns idem's in-flight refusal, as the server interceptor
// answers it: Aborted with an ErrorInfo of its reason and domain, and a
// RetryInfo of d.
func inFlight(d time.Duration) error {
	st, _ := status.New(codes.Aborted, "in flight").WithDetails(
		&errdetails.ErrorInfo{Reason: "IDEMPOTENCY_KEY_IN_USE", Domain: "github.com/idemkit/idem"},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	return st.Err()
}

// TestClientRetriesOnlyUnavailableAndInFlight: of every status code, only
// Unavailable is retried, and Aborted when it is idem's in-flight refusal
// (its ErrorInfo's reason and domain), not an application's own Aborted
// nor one with another domain's reason; a replayed answer never is,
// whatever its code; the call returns the last attempt's status as it was.
func TestClientRetriesOnlyUnavailableAndInFlight(t *testing.T) {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		var first error
		if c != codes.OK {
			first = status.Error(c, "first attempt: "+c.String())
		}
		f := &fakeServer{answers: []fakeAnswer{{err: first}, {}}}
		err := grpcidem.UnaryClientInterceptor(fast)(context.Background(), createMethod, nil, nil, nil, f.invoke)
		retried := c == codes.Unavailable
		switch {
		case retried && (f.attempts() != 2 || err != nil):
			t.Errorf("%v: %d attempts, %v; want a retry that succeeds", c, f.attempts(), err)
		case !retried && (f.attempts() != 1 || err != first):
			t.Errorf("%v: %d attempts, %v; want none and the status as it was", c, f.attempts(), err)
		}
	}
	f := &fakeServer{answers: []fakeAnswer{{err: inFlight(time.Millisecond)}, {}}}
	if err := grpcidem.UnaryClientInterceptor(fast)(context.Background(), createMethod, nil, nil, nil, f.invoke); err != nil || f.attempts() != 2 {
		t.Errorf("idem's in-flight Aborted: %v after %d attempts, want a retry that succeeds", err, f.attempts())
	}
	other, _ := status.New(codes.Aborted, "in flight elsewhere").WithDetails(
		&errdetails.ErrorInfo{Reason: "IDEMPOTENCY_KEY_IN_USE", Domain: "example.com"},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Millisecond)})
	f = &fakeServer{answers: []fakeAnswer{{err: other.Err()}, {}}}
	if err := grpcidem.UnaryClientInterceptor(fast)(context.Background(), createMethod, nil, nil, nil, f.invoke); status.Code(err) != codes.Aborted || f.attempts() != 1 {
		t.Errorf("another domain's Aborted: %v after %d attempts, want it returned", err, f.attempts())
	}
	replayed := metadata.Pairs(grpcidem.ReplayedHeader, "true")
	f = &fakeServer{answers: []fakeAnswer{{err: inFlight(time.Millisecond), header: replayed}, {}}}
	if err := grpcidem.UnaryClientInterceptor(fast)(context.Background(), createMethod, nil, nil, nil, f.invoke); status.Code(err) != codes.Aborted || f.attempts() != 1 {
		t.Errorf("a replayed Aborted: %v after %d attempts, want it returned", err, f.attempts())
	}
}

// TestClientDoesNotRetryApplicationAborted: a handler's own Aborted (an
// optimistic-lock failure, say) goes through the real server interceptor
// (which releases the key) and reaches the caller after one attempt; the
// handler ran once.
func TestClientDoesNotRetryApplicationAborted(t *testing.T) {
	e := start(t, setup{store: "memory", network: "bufconn", handler: func(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
		return nil, status.Error(codes.Aborted, "the order changed meanwhile")
	}})
	var attempts []grpcidem.Attempt
	in := grpcidem.UnaryClientInterceptor(fast, grpcidem.WithAttemptHook(func(a grpcidem.Attempt) { attempts = append(attempts, a) }))
	invoke := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		return cc.Invoke(ctx, method, req, reply, opts...)
	}
	var resp wrapperspb.StringValue
	err := in(testCtx(t), createMethod, order("book", 1), &resp, e.conn, invoke)
	if status.Code(err) != codes.Aborted || len(attempts) != 1 || e.runs() != 1 {
		t.Errorf("%v after %d attempts and %d runs, want the application's Aborted after 1", err, len(attempts), e.runs())
	}
}

// TestClientCapsAttempts: a call that keeps failing is sent 5 times, or
// WithMaxAttempts times; the last attempt says why it stopped, and the call
// returns its status.
func TestClientCapsAttempts(t *testing.T) {
	for _, c := range []struct {
		opts []grpcidem.ClientOption
		want int
	}{{nil, grpcidem.DefaultMaxAttempts}, {[]grpcidem.ClientOption{grpcidem.WithMaxAttempts(2)}, 2}, {[]grpcidem.ClientOption{grpcidem.WithMaxAttempts(1)}, 1}} {
		var last grpcidem.Attempt
		opts := append([]grpcidem.ClientOption{fast, grpcidem.WithAttemptHook(func(a grpcidem.Attempt) { last = a })}, c.opts...)
		unavailable := status.Error(codes.Unavailable, "down")
		f := &fakeServer{answers: []fakeAnswer{{err: unavailable}}}
		err := grpcidem.UnaryClientInterceptor(opts...)(context.Background(), createMethod, nil, nil, nil, f.invoke)
		if err != unavailable || f.attempts() != c.want || last.N != c.want || last.Retry || !errors.Is(last.Stop, grpcidem.ErrAttemptsExhausted) {
			t.Errorf("%v after %d attempts (last %+v), want Unavailable after %d", err, f.attempts(), last, c.want)
		}
	}
}

// TestClientRespectsDeadline: no wait is begun that would end at or after
// the context's deadline (the last status is returned at once), nor after
// WithMaxElapsed; a wait that the context ends returns the last status at
// once.
func TestClientRespectsDeadline(t *testing.T) {
	t.Run("server delay past the deadline", func(t *testing.T) {
		// A deadline far beyond what "at once" takes, even on a loaded
		// machine, and a delay beyond the deadline: a client that waits
		// would return at the deadline.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var last grpcidem.Attempt
		aborted := inFlight(time.Minute)
		f := &fakeServer{answers: []fakeAnswer{{err: aborted}}}
		began := time.Now()
		err := grpcidem.UnaryClientInterceptor(grpcidem.WithAttemptHook(func(a grpcidem.Attempt) { last = a }))(ctx, createMethod, nil, nil, nil, f.invoke)
		if err != aborted || f.attempts() != 1 || !errors.Is(last.Stop, grpcidem.ErrTimeExhausted) || time.Since(began) > 10*time.Second {
			t.Errorf("%v after %d attempts and %v (stop %v), want Aborted at once", err, f.attempts(), time.Since(began), last.Stop)
		}
	})
	t.Run("backoff until the deadline", func(t *testing.T) {
		const budget = 300 * time.Millisecond
		const maxWait = 40 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		deadline, _ := ctx.Deadline()
		var starts []time.Time
		var ended []time.Time // when each attempt had returned: the client's clock of it, and its wait, came later
		var attempts []grpcidem.Attempt
		unavailable := status.Error(codes.Unavailable, "down")
		f := &fakeServer{answers: []fakeAnswer{{err: unavailable}}}
		invoke := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
			starts = append(starts, time.Now())
			defer func() { ended = append(ended, time.Now()) }()
			return f.invoke(ctx, method, req, reply, cc, opts...)
		}
		hook := grpcidem.WithAttemptHook(func(a grpcidem.Attempt) { attempts = append(attempts, a) })
		err := grpcidem.UnaryClientInterceptor(grpcidem.WithMaxAttempts(1000), grpcidem.WithBackoff(20*time.Millisecond, maxWait), hook)(ctx, createMethod, nil, nil, nil, invoke)
		returned := time.Now()
		// What the client decided, not when its timers fired (late, on a
		// loaded machine): no wait begun that would end at or after the
		// deadline, and no attempt started then; the last attempt not
		// retried, for want of time.
		if err != unavailable || len(attempts) == 0 || len(attempts) != len(starts) {
			t.Fatalf("%v after %d attempts (%d hooked), want Unavailable", err, len(starts), len(attempts))
		}
		for i, a := range attempts {
			if a.Retry && !ended[i].Add(a.Wait).Before(deadline) {
				t.Errorf("attempt %d: a wait of %v begun %v before the deadline", i+1, a.Wait, deadline.Sub(ended[i]))
			}
		}
		for i, s := range starts {
			if !s.Before(deadline) {
				t.Errorf("attempt %d started at or after the deadline", i+1)
			}
		}
		// The last attempt is not retried, for want of time; or its wait
		// fitted before the deadline (checked above) but its timer fired
		// late on a loaded machine, and the context's end cut it: the
		// client then returns at the deadline, with the last status.
		last := len(attempts) - 1
		switch a := attempts[last]; {
		case a.Retry && returned.Before(deadline):
			t.Errorf("the last attempt: retried (wait %v), yet the client returned %v before the deadline", a.Wait, deadline.Sub(returned))
		case !a.Retry && !errors.Is(a.Stop, grpcidem.ErrTimeExhausted):
			t.Errorf("the last attempt: retry %t, stop %v; want no retry, for want of time", a.Retry, a.Stop)
		}
		// At least one retry, unless the machine kept the first attempt
		// until no wait fitted before the deadline. The client judged on
		// its clock after the attempt, before it returned, with a wait of
		// at most maxWait: a wait fitted surely if it did from returned.
		if len(starts) < 2 {
			if returned.Add(maxWait).Before(deadline) {
				t.Errorf("no retry, though the client returned %v before the deadline", deadline.Sub(returned))
			} else {
				t.Skipf("the first attempt ended %v before the deadline, too late for a wait of up to %v (a loaded machine): no verdict on the retries",
					deadline.Sub(ended[0]), maxWait)
			}
		}
	})
	t.Run("WithMaxElapsed", func(t *testing.T) {
		aborted := inFlight(time.Second)
		f := &fakeServer{answers: []fakeAnswer{{err: aborted}}}
		err := grpcidem.UnaryClientInterceptor(grpcidem.WithMaxElapsed(100*time.Millisecond))(context.Background(), createMethod, nil, nil, nil, f.invoke)
		if err != aborted || f.attempts() != 1 {
			t.Errorf("%v after %d attempts, want Aborted at once", err, f.attempts())
		}
	})
	t.Run("canceled while waiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		aborted := inFlight(20 * time.Second)
		f := &fakeServer{answers: []fakeAnswer{{err: aborted}}}
		began := time.Now()
		err := grpcidem.UnaryClientInterceptor(grpcidem.WithAttemptHook(func(a grpcidem.Attempt) {
			if a.Retry {
				cancel() // the caller gives up during the wait
			}
		}))(ctx, createMethod, nil, nil, nil, f.invoke)
		if err != aborted || f.attempts() != 1 || time.Since(began) > 10*time.Second {
			t.Errorf("%v after %d attempts and %v, want Aborted at once", err, f.attempts(), time.Since(began))
		}
	})
}

// TestClientKeys: every attempt of a call carries one key, 128 random
// bits in base64url, and each call its own; a key the caller put in the
// metadata is kept, alone; WithClientKeyHeader names the entry;
// WithClientMethods leaves other methods alone (no key, no retry). No
// Attempt shows the key.
func TestClientKeys(t *testing.T) {
	unavailable := fakeAnswer{err: status.Error(codes.Unavailable, "down")}
	var seen []string
	hook := grpcidem.WithAttemptHook(func(a grpcidem.Attempt) { seen = append(seen, fmt.Sprintf("%+v", a)) })
	in := grpcidem.UnaryClientInterceptor(fast, hook)
	f := &fakeServer{answers: []fakeAnswer{unavailable, unavailable, {}}}
	if err := in(context.Background(), createMethod, nil, nil, nil, f.invoke); err != nil {
		t.Fatal(err)
	}
	if err := in(context.Background(), createMethod, nil, nil, nil, f.invoke); err != nil {
		t.Fatal(err)
	}
	generated := regexp.MustCompile(`^[A-Za-z0-9_-]{22}$`)
	for i, k := range f.keys {
		if len(k) != 1 || !generated.MatchString(k[0]) {
			t.Fatalf("attempt %d carried %q, want one generated key", i+1, k)
		}
		for _, s := range seen {
			if strings.Contains(s, k[0]) {
				t.Errorf("an Attempt shows the key: %s", s)
			}
		}
	}
	if f.keys[0][0] != f.keys[1][0] || f.keys[1][0] != f.keys[2][0] || f.keys[3][0] == f.keys[0][0] {
		t.Errorf("keys %q: want one per call, the same on each attempt", f.keys)
	}

	f = &fakeServer{answers: []fakeAnswer{unavailable, {}}}
	ctx := metadata.AppendToOutgoingContext(context.Background(), grpcidem.DefaultKeyHeader, "order-42")
	if err := in(ctx, createMethod, nil, nil, nil, f.invoke); err != nil || len(f.keys) != 2 || len(f.keys[1]) != 1 || f.keys[1][0] != "order-42" {
		t.Errorf("the caller's key: sent %q (%v), want order-42 on each attempt", f.keys, err)
	}

	f = &fakeServer{header: "x-request-key", answers: []fakeAnswer{{}}}
	if err := grpcidem.UnaryClientInterceptor(grpcidem.WithClientKeyHeader("X-Request-Key"))(context.Background(), createMethod, nil, nil, nil, f.invoke); err != nil || len(f.keys[0]) != 1 {
		t.Errorf("WithClientKeyHeader: sent %q", f.keys)
	}

	f = &fakeServer{answers: []fakeAnswer{unavailable, {}}}
	only := grpcidem.UnaryClientInterceptor(fast, grpcidem.WithClientMethods(describeMethod))
	if err := only(context.Background(), createMethod, nil, nil, nil, f.invoke); status.Code(err) != codes.Unavailable || f.attempts() != 1 || len(f.keys[0]) != 0 {
		t.Errorf("another method: %v after %d attempts with keys %q, want it untouched", err, f.attempts(), f.keys)
	}
}

// TestServerDelay: the delay the client waits for is the RetryInfo when
// there is one, else retry-after (header, then trailer), capped at 24 h.
func TestServerDelay(t *testing.T) {
	h := func(v string) metadata.MD { return metadata.Pairs(grpcidem.RetryAfterHeader, v) }
	for _, c := range []struct {
		name            string
		err             error
		header, trailer metadata.MD
		want            time.Duration
	}{
		{"RetryInfo", withDelay(codes.Aborted, 1500*time.Millisecond), h("7"), nil, 1500 * time.Millisecond},
		{"header", status.Error(codes.Unavailable, "x"), h("3"), h("9"), 3 * time.Second},
		{"trailer", status.Error(codes.Unavailable, "x"), nil, h("9"), 9 * time.Second},
		{"malformed", status.Error(codes.Unavailable, "x"), h("soon"), nil, 0},
		{"huge", status.Error(codes.Unavailable, "x"), h("99999999999999999999999"), nil, 24 * time.Hour},
		{"zero RetryInfo", withDelay(codes.Aborted, 0), nil, nil, 0},
		{"none", status.Error(codes.Unavailable, "x"), nil, nil, 0},
	} {
		if got := grpcidem.ServerDelay(c.err, c.header, c.trailer); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestBackoff: without a server delay, the wait after attempt n is at
// most min(max, base*2^(n-1)); with one, the delay plus up to a tenth.
func TestBackoff(t *testing.T) {
	base, ceil := 100*time.Millisecond, 10*time.Second
	for n := 1; n <= 70; n++ {
		limit := ceil
		if n < 10 {
			limit = min(ceil, base<<(n-1))
		}
		for range 20 {
			if w := grpcidem.Backoff(base, ceil, n, 0); w < 0 || w > limit {
				t.Fatalf("attempt %d: waited %v, want at most %v", n, w, limit)
			}
		}
	}
	for range 20 {
		if w := grpcidem.Backoff(base, ceil, 1, 2*time.Second); w < 2*time.Second || w > 2200*time.Millisecond {
			t.Fatalf("a server delay of 2s: waited %v", w)
		}
	}
}

// TestOptionsPanic: invalid option values panic, naming the option.
func TestOptionsPanic(t *testing.T) {
	for name, f := range map[string]func(){
		"WithKeyHeader empty":            func() { grpcidem.WithKeyHeader("") },
		"WithKeyHeader grpc-":            func() { grpcidem.WithKeyHeader("grpc-key") },
		"WithKeyHeader -bin":             func() { grpcidem.WithKeyHeader("key-bin") },
		"WithKeyHeader space":            func() { grpcidem.WithKeyHeader("a key") },
		"WithClientKeyHeader colon":      func() { grpcidem.WithClientKeyHeader(":key") },
		"WithScope nil":                  func() { grpcidem.WithScope(nil) },
		"WithStoredCodes nil":            func() { grpcidem.WithStoredCodes(nil) },
		"WithMethods none":               func() { grpcidem.WithMethods() },
		"WithMethods short":              func() { grpcidem.WithMethods("Create") },
		"WithClientMethods none":         func() { grpcidem.WithClientMethods() },
		"WithMaxAttempts 0":              func() { grpcidem.WithMaxAttempts(0) },
		"WithMaxElapsed negative":        func() { grpcidem.WithMaxElapsed(-1) },
		"WithBackoff zero base":          func() { grpcidem.WithBackoff(0, time.Second) },
		"WithBackoff max below base":     func() { grpcidem.WithBackoff(time.Second, time.Millisecond) },
		"WithPerAttemptTimeout negative": func() { grpcidem.WithPerAttemptTimeout(-time.Second) },
		"WithMaxReply 0":                 func() { grpcidem.WithMaxReply(0) },
		"nil middleware":                 func() { grpcidem.UnaryServerInterceptor(nil) },
	} {
		func() {
			defer func() {
				if p := recover(); p == nil {
					t.Errorf("%s: no panic", name)
				} else if s := fmt.Sprint(p); !regexp.MustCompile(`^grpcidem: `).MatchString(s) {
					t.Errorf("%s: panic %q", name, s)
				}
			}()
			f()
		}()
	}
}

// TestClientPerAttemptTimeout: WithPerAttemptTimeout gives each attempt
// its own deadline within the call's; an attempt that ran out of it is
// retried with the same key, and one that ran out of the call's own
// deadline is not.
func TestClientPerAttemptTimeout(t *testing.T) {
	t.Run("retried", func(t *testing.T) {
		var keys [][]string
		var deadlines, invoked []time.Time
		invoke := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
			invoked = append(invoked, time.Now())
			keys = append(keys, metadata.ValueFromOutgoingContext(ctx, grpcidem.DefaultKeyHeader))
			d, _ := ctx.Deadline()
			deadlines = append(deadlines, d)
			if len(keys) == 1 {
				<-ctx.Done()
				return status.FromContextError(ctx.Err()).Err()
			}
			return nil
		}
		var attempts []grpcidem.Attempt
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		began := time.Now()
		err := grpcidem.UnaryClientInterceptor(fast, grpcidem.WithPerAttemptTimeout(50*time.Millisecond),
			grpcidem.WithAttemptHook(func(a grpcidem.Attempt) { attempts = append(attempts, a) }))(ctx, createMethod, nil, nil, nil, invoke)
		if err != nil || len(keys) != 2 || len(keys[0]) != 1 || len(keys[1]) != 1 || keys[0][0] != keys[1][0] {
			t.Fatalf("%v after attempts with keys %q, want a second attempt with the same key that succeeds", err, keys)
		}
		if len(attempts) != 2 || attempts[0].Code != codes.DeadlineExceeded || !attempts[0].Retry {
			t.Errorf("attempts %v, want DeadlineExceeded retried", codesOf(attempts))
		}
		// The deadline is 50 ms after a moment between the call's start
		// and the attempt's: however late the attempt started.
		if d := deadlines[0]; d.Before(began.Add(50*time.Millisecond)) || d.After(invoked[0].Add(50*time.Millisecond)) {
			t.Errorf("the first attempt's deadline is %v after the call began, the attempt %v after it; want 50ms after something in between",
				d.Sub(began), invoked[0].Sub(began))
		}
	})
	t.Run("the call's deadline", func(t *testing.T) {
		n := 0
		invoke := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
			n++
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		err := grpcidem.UnaryClientInterceptor(fast, grpcidem.WithPerAttemptTimeout(time.Second))(ctx, createMethod, nil, nil, nil, invoke)
		if status.Code(err) != codes.DeadlineExceeded || n != 1 {
			t.Errorf("%v after %d attempts, want DeadlineExceeded after 1", err, n)
		}
	})
	t.Run("without it", func(t *testing.T) {
		n := 0
		invoke := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
			n++
			return status.Error(codes.DeadlineExceeded, "a deadline of the server's own")
		}
		err := grpcidem.UnaryClientInterceptor(fast, grpcidem.WithPerAttemptTimeout(time.Second))(context.Background(), createMethod, nil, nil, nil, invoke)
		if status.Code(err) != codes.DeadlineExceeded || n != 1 {
			t.Errorf("a DeadlineExceeded before the attempt's deadline: %v after %d attempts, want it returned", err, n)
		}
	})
}

// TestClientPerAttemptTimeoutThroughServer: the first attempt times out
// while the handler still runs; the retry, with the same key, gets idem's
// in-flight Aborted and waits it out, and the next gets the first run's
// answer replayed. The handler ran once.
func TestClientPerAttemptTimeoutThroughServer(t *testing.T) {
	e := start(t, setup{store: "memory", network: "bufconn", handler: func(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
		time.Sleep(300 * time.Millisecond) // past the attempt's deadline, ignoring it
		return wrapperspb.String("order created"), nil
	}})
	var attempts []grpcidem.Attempt
	in := grpcidem.UnaryClientInterceptor(grpcidem.WithPerAttemptTimeout(100*time.Millisecond),
		grpcidem.WithAttemptHook(func(a grpcidem.Attempt) { attempts = append(attempts, a) }))
	invoke := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		return cc.Invoke(ctx, method, req, reply, opts...)
	}
	var resp wrapperspb.StringValue
	var header metadata.MD
	err := in(testCtx(t), createMethod, order("book", 1), &resp, e.conn, invoke, grpc.Header(&header))
	if err != nil || resp.GetValue() != "order created" || len(header.Get(grpcidem.ReplayedHeader)) != 1 {
		t.Fatalf("%v, %v, header %v; want the replay", &resp, err, header)
	}
	if len(attempts) < 2 || attempts[0].Code != codes.DeadlineExceeded || !attempts[len(attempts)-1].Replayed {
		t.Errorf("attempts %v, want DeadlineExceeded first and a replay last", codesOf(attempts))
	}
	if e.runs() != 1 {
		t.Errorf("the handler ran %d times, want 1", e.runs())
	}
}
