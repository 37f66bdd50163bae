package grpcidem_test

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/grpcidem"
	"github.com/idemkit/idem/storage"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestConcurrentDuplicates: 20 calls at once with one key run the handler
// once; while it runs the 19 others get Aborted with a RetryInfo detail
// and a retry-after header, none holding the key; the next retry gets
// the replay.
func TestConcurrentDuplicates(t *testing.T) {
	matrix(t, func(t *testing.T, s setup) {
		release := make(chan struct{})
		s.handler = func(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
			<-release
			grpc.SetHeader(ctx, metadata.Pairs("x-order", "1"))
			return wrapperspb.String("order 1"), nil
		}
		e := start(t, s)
		const calls = 20
		key := "dup-" + randomHex()
		answers := make(chan answer, calls)
		var wg sync.WaitGroup
		for range calls {
			wg.Go(func() { answers <- e.call(testCtx(t), createMethod, key, order("book", 12)) })
		}
		for i := range calls - 1 {
			a := within(t, answers, "the duplicates' refusals")
			if a.code() != codes.Aborted {
				close(release)
				wg.Wait()
				t.Fatalf("duplicate %d: %v, want Aborted while the first runs", i, a)
			}
			if d := retryInfo(a.err); d <= 0 || d > idem.DefaultLease {
				t.Errorf("duplicate %d: RetryInfo delay %v, want in (0, %v]", i, d, idem.DefaultLease)
			}
			if ra := a.header.Get(grpcidem.RetryAfterHeader); len(ra) != 1 || atoi(ra[0]) < 1 {
				t.Errorf("duplicate %d: retry-after %q, want whole seconds >= 1", i, ra)
			}
			if strings.Contains(a.err.Error(), key) {
				t.Errorf("duplicate %d: the status holds the key: %v", i, a.err)
			}
		}
		close(release)
		wg.Wait()
		first := within(t, answers, "the first call")
		if first.err != nil || first.replayed() {
			t.Fatalf("the first call: %v", first)
		}
		again := e.call(testCtx(t), createMethod, key, order("book", 12))
		if again.err != nil || !again.replayed() || !bytes.Equal(again.raw, first.raw) {
			t.Errorf("the retry: %v, want the first's response replayed", again)
		}
		if n := e.runs(); n != 1 {
			t.Errorf("the handler ran %d times, want 1", n)
		}
	})
}

// TestConcurrentDuplicatesWithClientRetries: 20 calls at once with one
// key, through the client interceptor, all end OK with the same response:
// the handler ran once, one answer is its own, 19 are replays got after
// waiting out Aborted.
func TestConcurrentDuplicatesWithClientRetries(t *testing.T) {
	matrix(t, func(t *testing.T, s setup) {
		const calls = 20
		var aborted atomic.Int64
		release := make(chan struct{})
		s.dial = []grpc.DialOption{grpc.WithChainUnaryInterceptor(grpcidem.UnaryClientInterceptor(
			grpcidem.WithMaxAttempts(10),
			grpcidem.WithAttemptHook(func(a grpcidem.Attempt) {
				if a.Code == codes.Aborted && aborted.Add(1) == calls-1 {
					close(release) // every duplicate was turned away once
				}
			}),
		))}
		s.handler = func(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
			<-release
			return wrapperspb.String("order 1"), nil
		}
		e := start(t, s)
		key := "dup-" + randomHex()
		answers := make(chan answer, calls)
		var wg sync.WaitGroup
		for range calls {
			wg.Go(func() { answers <- e.call(testCtx(t), createMethod, key, order("book", 12)) })
		}
		wg.Wait()
		close(answers)
		replays := 0
		var raw []byte
		for a := range answers {
			if a.err != nil {
				t.Fatalf("a call: %v", a)
			}
			if a.replayed() {
				replays++
			}
			if raw != nil && !bytes.Equal(raw, a.raw) {
				t.Errorf("responses differ: %x and %x", raw, a.raw)
			}
			raw = a.raw
		}
		if replays != calls-1 || e.runs() != 1 {
			t.Errorf("%d replays and %d runs, want %d and 1", replays, e.runs(), calls-1)
		}
	})
}

// TestReplayIdentical: a retry gets what the first call got: the
// response's bytes, the header metadata (SetHeader and SendHeader, text
// and binary, plus idempotent-replayed: true), the trailer metadata;
// for a stored error status its code, message and details; for a message
// with maps the same message.
func TestReplayIdentical(t *testing.T) {
	matrix(t, func(t *testing.T, s setup) {
		s.handler = func(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
			grpc.SetHeader(ctx, metadata.Pairs("x-order", "7", "x-trace-bin", "\x00\x01\xfe\xff"))
			grpc.SetTrailer(ctx, metadata.Pairs("x-ledger", "a", "x-ledger", "b"))
			switch req.Fields["item"].GetStringValue() {
			case "book":
				grpc.SendHeader(ctx, metadata.Pairs("x-sent", "early"))
				return &wrapperspb.StringValue{Value: "order 7: " + req.Fields["item"].GetStringValue()}, nil
			case "missing":
				st, _ := status.New(codes.NotFound, "no such item: missing").WithDetails(
					&errdetails.ErrorInfo{Reason: "NO_ITEM", Domain: "orders.test", Metadata: map[string]string{"item": "missing", "shelf": "7"}},
					&errdetails.ResourceInfo{ResourceType: "item", ResourceName: "missing"},
				)
				return nil, st.Err()
			}
			return structpb.NewStruct(map[string]any{"order": 7, "item": "pen", "tags": []any{"a", "b"}, "note": map[string]any{"x": 1, "y": "z"}})
		}
		e := start(t, s)

		check := func(t *testing.T, method string, req *structpb.Struct) (first, again answer) {
			key := "replay-" + randomHex()
			first = e.call(testCtx(t), method, key, req)
			runs := e.runs()
			again = e.call(testCtx(t), method, key, req)
			if e.runs() != runs {
				t.Errorf("the retry ran the handler")
			}
			if first.replayed() || !again.replayed() {
				t.Errorf("replayed marks: first %v, retry %v; want false, true", first.replayed(), again.replayed())
			}
			h := again.header.Copy()
			delete(h, grpcidem.ReplayedHeader)
			if !mdEqual(first.header, h) {
				t.Errorf("header: first %v, retry %v", first.header, again.header)
			}
			if !mdEqual(first.trailer, again.trailer) {
				t.Errorf("trailer: first %v, retry %v", first.trailer, again.trailer)
			}
			return first, again
		}

		t.Run("response", func(t *testing.T) {
			first, again := check(t, createMethod, order("book", 1))
			if first.err != nil || again.err != nil || !bytes.Equal(first.raw, again.raw) {
				t.Errorf("first %v, retry %v: want the same bytes", first, again)
			}
			if first.header.Get("x-trace-bin")[0] != "\x00\x01\xfe\xff" || first.header.Get("x-sent")[0] != "early" {
				t.Errorf("header %v: want what the handler set", first.header)
			}
		})
		t.Run("status", func(t *testing.T) {
			first, again := check(t, createMethod, order("missing", 1))
			a, b := status.Convert(first.err).Proto(), status.Convert(again.err).Proto()
			if a.GetCode() != int32(codes.NotFound) || len(a.GetDetails()) != 2 || !proto.Equal(a, b) {
				t.Errorf("status: first %v, retry %v", a, b)
			}
		})
		t.Run("map", func(t *testing.T) {
			first, again := check(t, describeMethod, order("pen", 1))
			var x, y structpb.Struct
			if first.err != nil || again.err != nil || proto.Unmarshal(first.raw, &x) != nil || proto.Unmarshal(again.raw, &y) != nil || !proto.Equal(&x, &y) {
				t.Errorf("first %v, retry %v: want the same message", first, again)
			}
		})
	})
}

// atoi returns s as a number, or -1.
func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// mdEqual reports whether a and b hold the same entries, a key with no
// value being no entry.
func mdEqual(a, b metadata.MD) bool {
	n := 0
	for k, vs := range a {
		if len(vs) == 0 {
			continue
		}
		n++
		ws := b[k]
		if len(ws) != len(vs) {
			return false
		}
		for i := range vs {
			if vs[i] != ws[i] {
				return false
			}
		}
	}
	for _, vs := range b {
		if len(vs) > 0 {
			n--
		}
	}
	return n == 0
}

// TestMismatch: the same key with another request gets
// FailedPrecondition and the handler does not run; WithoutFingerprint
// gives it the first's response instead.
func TestMismatch(t *testing.T) {
	matrix(t, func(t *testing.T, s setup) {
		e := start(t, s)
		key := "mismatch-" + randomHex()
		if a := e.call(testCtx(t), createMethod, key, order("book", 12)); a.err != nil {
			t.Fatal(a)
		}
		a := e.call(testCtx(t), createMethod, key, order("book", 99))
		if a.code() != codes.FailedPrecondition || e.runs() != 1 || strings.Contains(a.err.Error(), key) {
			t.Errorf("another request: %v after %d runs, want FailedPrecondition and 1 run", a, e.runs())
		}
		if a := e.call(testCtx(t), describeMethod, key, order("book", 99)); a.err != nil || a.replayed() {
			t.Errorf("the same key on another method: %v, want its own run", a)
		}
	})
	t.Run("WithoutFingerprint", func(t *testing.T) {
		e := start(t, setup{store: "memory", network: "bufconn", server: []grpcidem.Option{grpcidem.WithoutFingerprint()}})
		key := "mismatch-" + randomHex()
		first := e.call(testCtx(t), createMethod, key, order("book", 12))
		a := e.call(testCtx(t), createMethod, key, order("book", 99))
		if a.err != nil || !a.replayed() || !bytes.Equal(a.raw, first.raw) || e.runs() != 1 {
			t.Errorf("another request: %v, want the first's response", a)
		}
	})
}

// TestReleasedStatusRunsAgain: a status that is not stored (Unavailable
// from the handler) releases the key: the retry runs the handler, and its
// response is then replayed.
func TestReleasedStatusRunsAgain(t *testing.T) {
	matrix(t, func(t *testing.T, s setup) {
		var n atomic.Int64
		s.handler = func(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
			if n.Add(1) == 1 {
				grpc.SetHeader(ctx, metadata.Pairs("x-attempt", "1"))
				return nil, status.Error(codes.Unavailable, "the database is restarting")
			}
			return wrapperspb.String("created"), nil
		}
		e := start(t, s)
		key := "released-" + randomHex()
		for i, want := range []struct {
			code     codes.Code
			replayed bool
			runs     int64
		}{{codes.Unavailable, false, 1}, {codes.OK, false, 2}, {codes.OK, true, 2}} {
			a := e.call(testCtx(t), createMethod, key, order("book", 12))
			if a.code() != want.code || a.replayed() != want.replayed || e.runs() != want.runs {
				t.Errorf("call %d: %v after %d runs, want %v, replayed %v, %d runs", i+1, a, e.runs(), want.code, want.replayed, want.runs)
			}
		}
	})
}

// TestStoredCodes: by default, each status code is stored (the retry gets
// it again, replayed) or released (the retry runs the handler) as
// DefaultStored's documentation lists; WithStoredCodes replaces the rule.
func TestStoredCodes(t *testing.T) {
	stored := map[codes.Code]bool{
		codes.OK: true, codes.InvalidArgument: true, codes.NotFound: true, codes.AlreadyExists: true,
		codes.FailedPrecondition: true, codes.PermissionDenied: true, codes.OutOfRange: true,
		codes.Unimplemented: true, codes.Unauthenticated: true,
	}
	for c := codes.OK; c <= codes.Unauthenticated+1; c++ {
		if grpcidem.DefaultStored(c) != stored[c] {
			t.Errorf("DefaultStored(%v) = %v, want %v", c, !stored[c], stored[c])
		}
	}
	handler := func(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
		c := codes.Code(req.Fields["amount"].GetNumberValue())
		if c == codes.OK {
			return wrapperspb.String("ok"), nil
		}
		return nil, status.Error(c, "status "+c.String())
	}
	run := func(t *testing.T, e *env, rule func(codes.Code) bool) {
		for c := codes.OK; c <= codes.Unauthenticated; c++ {
			key := "code-" + randomHex()
			req := order("book", float64(c))
			before := e.runs()
			first := e.call(testCtx(t), createMethod, key, req)
			again := e.call(testCtx(t), createMethod, key, req)
			switch {
			case first.code() != c || again.code() != c:
				t.Errorf("%v: got %v then %v", c, first, again)
			case rule(c) && (!again.replayed() || e.runs()-before != 1):
				t.Errorf("%v: the retry ran the handler (runs %d) or is not replayed: %v", c, e.runs()-before, again)
			case !rule(c) && (again.replayed() || e.runs()-before != 2):
				t.Errorf("%v: the retry did not run the handler again (runs %d): %v", c, e.runs()-before, again)
			}
		}
	}
	t.Run("default", func(t *testing.T) {
		run(t, start(t, setup{store: "memory", network: "bufconn", handler: handler}), grpcidem.DefaultStored)
	})
	t.Run("WithStoredCodes", func(t *testing.T) {
		rule := func(c codes.Code) bool { return c == codes.Unavailable }
		e := start(t, setup{store: "memory", network: "bufconn", handler: handler, server: []grpcidem.Option{grpcidem.WithStoredCodes(rule)}})
		run(t, e, func(c codes.Code) bool { return c == codes.OK || rule(c) })
	})
}

// TestPanicReleasesKey: a handler that panics releases its key; the
// recovery interceptor outside answers Internal, and the retry runs the
// handler again.
func TestPanicReleasesKey(t *testing.T) {
	matrix(t, func(t *testing.T, s setup) {
		var n atomic.Int64
		s.handler = func(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
			if n.Add(1) == 1 {
				panic("boom")
			}
			return wrapperspb.String("created"), nil
		}
		e := start(t, s)
		key := "panic-" + randomHex()
		if a := e.call(testCtx(t), createMethod, key, order("book", 12)); a.code() != codes.Internal {
			t.Fatalf("the panicking call: %v, want Internal", a)
		}
		if a := e.call(testCtx(t), createMethod, key, order("book", 12)); a.err != nil || a.replayed() || e.runs() != 2 {
			t.Errorf("the retry: %v after %d runs, want a run of its own", a, e.runs())
		}
		if a := e.call(testCtx(t), createMethod, key, order("book", 12)); a.err != nil || !a.replayed() || e.runs() != 2 {
			t.Errorf("the next retry: %v after %d runs, want the replay", a, e.runs())
		}
	})
}

// TestLeaseRenewal: a handler that runs for three leases keeps its key:
// the duplicates sent all along get Aborted and never run it; afterwards
// the retry gets its response.
func TestLeaseRenewal(t *testing.T) {
	stores(t, func(t *testing.T, s setup) {
		// The middleware renews the lease on a real clock (lease/3): on
		// a loaded machine a renewal may come after the lease ran out,
		// and a duplicate run the handler. The test sees it (leaseLog)
		// and tries again with a longer lease.
		inTime(t, 500*time.Millisecond, func(lease time.Duration) bool { return testLeaseRenewal(t, s, lease) })
	})
}

// testLeaseRenewal is an attempt of TestLeaseRenewal with lease; it
// returns false when a duplicate ran the handler after the lease may have
// run out, its renewals late.
func testLeaseRenewal(t *testing.T, s setup, lease time.Duration) bool {
	log := new(leaseLog)
	s.idem = []idem.Option{idem.WithLease(lease)}
	s.wrapStore = func(st storage.Store) storage.Store { log.Store = st; return log }
	release := make(chan struct{})
	entered := make(chan struct{})
	var first atomic.Bool
	s.handler = func(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
		if first.CompareAndSwap(false, true) {
			close(entered)
			<-release
		}
		return wrapperspb.String("done"), nil
	}
	e := start(t, s)
	key := "lease-" + randomHex()
	firstDone := make(chan answer, 1)
	go func() { firstDone <- e.call(testCtx(t), createMethod, key, order("book", 12)) }()
	within(t, entered, "the handler")
	began := time.Now()
	pace := time.NewTicker(lease / 10) // a duplicate every tenth of a lease
	defer pace.Stop()
	duplicates := 0
	for ; time.Since(began) < 3*lease || duplicates < 5; <-pace.C {
		a := e.call(testCtx(t), createMethod, key, order("book", 12))
		if a.code() != codes.Aborted {
			close(release)
			within(t, firstDone, "the first call")
			if log.Lapsed(lease, time.Now()) {
				return false
			}
			t.Fatalf("duplicate %d after %v: %v, want Aborted", duplicates, time.Since(began), a)
		}
		if d := retryInfo(a.err); d != time.Second { // at least 1 s, at most the lease left past that
			t.Errorf("duplicate %d: RetryInfo %v, want 1s", duplicates, d)
		}
		duplicates++
	}
	close(release)
	if a := within(t, firstDone, "the first call"); a.err != nil {
		t.Fatalf("the first call: %v", a)
	}
	if a := e.call(testCtx(t), createMethod, key, order("book", 12)); a.err != nil || !a.replayed() {
		t.Errorf("the retry: %v, want the replay", a)
	}
	if e.runs() != 1 {
		t.Errorf("the handler ran %d times, want 1", e.runs())
	}
	return true
}

// TestGracefulStopThenShutdown: the deploy order, GracefulStop and then
// the middleware's Shutdown, loses no record: the calls in flight end OK,
// and after the restart every retry gets its replay.
func TestGracefulStopThenShutdown(t *testing.T) {
	for _, kind := range []string{"memory", "redis"} {
		t.Run(kind, func(t *testing.T) {
			const calls = 5
			release := make(chan struct{})
			entered := make(chan struct{}, calls)
			s := setup{store: kind, network: "tcp", handler: func(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
				entered <- struct{}{}
				<-release
				return wrapperspb.String("order for " + req.Fields["item"].GetStringValue()), nil
			}}
			store := newStore(t, kind)
			e := startOn(t, s, store)
			keys := make([]string, calls)
			answers := make([]answer, calls)
			var wg sync.WaitGroup
			for i := range keys {
				keys[i] = "deploy-" + randomHex()
				wg.Go(func() { answers[i] = e.call(testCtx(t), createMethod, keys[i], order(keys[i], 1)) })
			}
			for range calls {
				within(t, entered, "the handlers")
			}
			stopped := make(chan struct{})
			go func() { e.srv.GracefulStop(); close(stopped) }()
			waitRefused(t, e.addr) // GracefulStop closed the listener first
			close(release)
			within(t, stopped, "GracefulStop")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := e.m.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			wg.Wait()
			e.stop()
			for i, a := range answers {
				if a.err != nil {
					t.Errorf("call %d: %v", i, a)
				}
			}
			// The next release of the service, on the same store.
			next := startOn(t, setup{store: kind, network: "tcp", handler: okHandler}, store)
			for i, key := range keys {
				a := next.call(testCtx(t), createMethod, key, order(key, 1))
				if a.err != nil || !a.replayed() || !bytes.Equal(a.raw, answers[i].raw) {
					t.Errorf("retry %d after the restart: %v, want the replay", i, a)
				}
			}
			if e.runs() != calls || next.runs() != 0 {
				t.Errorf("runs: %d before the restart, %d after; want %d and 0", e.runs(), next.runs(), calls)
			}
		})
	}
}

// waitRefused polls addr until it refuses connections (at most 10 s).
func waitRefused(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("%s still accepts connections", addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStoreOutage: with the store down a call gets Unavailable (with a
// RetryInfo and retry-after) and the handler does not run; once the store
// is back the retry runs it. With idem.WithFailOpen the handler runs
// unprotected instead.
func TestStoreOutage(t *testing.T) {
	stores(t, func(t *testing.T, s setup) {
		var fs *failingStore
		s.wrapStore = func(st storage.Store) storage.Store { fs = &failingStore{Store: st}; return fs }
		e := start(t, s)
		fs.down.Store(true)
		key := "outage-" + randomHex()
		a := e.call(testCtx(t), createMethod, key, order("book", 12))
		if a.code() != codes.Unavailable || retryInfo(a.err) <= 0 || len(a.header.Get(grpcidem.RetryAfterHeader)) != 1 || e.runs() != 0 {
			t.Errorf("store down: %v after %d runs, want Unavailable with a delay, no run", a, e.runs())
		}
		fs.down.Store(false)
		if a := e.call(testCtx(t), createMethod, key, order("book", 12)); a.err != nil || a.replayed() || e.runs() != 1 {
			t.Errorf("store back: %v after %d runs, want a run", a, e.runs())
		}
	})
	t.Run("WithFailOpen", func(t *testing.T) {
		var outcomes []idem.Outcome
		var mu sync.Mutex
		var fs *failingStore
		e := start(t, setup{store: "memory", network: "bufconn",
			wrapStore: func(st storage.Store) storage.Store { fs = &failingStore{Store: st}; return fs },
			idem: []idem.Option{idem.WithFailOpen(), idem.WithObserver(func(ev idem.Event) {
				mu.Lock()
				outcomes = append(outcomes, ev.Outcome)
				mu.Unlock()
			})},
		})
		fs.down.Store(true)
		key := "outage-" + randomHex()
		for i := range 2 {
			if a := e.call(testCtx(t), createMethod, key, order("book", 12)); a.err != nil || a.replayed() || e.runs() != int64(i+1) {
				t.Errorf("call %d with the store down: %v after %d runs, want an unprotected run", i+1, a, e.runs())
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(outcomes) != 2 || outcomes[0] != idem.FailedOpen || outcomes[1] != idem.FailedOpen {
			t.Errorf("events %v, want two failed-open", outcomes)
		}
	})
}

// TestInvalidKey: an empty key, one longer than 255 bytes, one with a
// control character, and a key sent twice get InvalidArgument without a
// run; the status never holds the key. 255 bytes of printable ASCII are
// a key.
func TestInvalidKey(t *testing.T) {
	e := start(t, setup{store: "memory", network: "bufconn"})
	long := strings.Repeat("k", idem.MaxKeyLen+1)
	for _, md := range [][]string{
		{grpcidem.DefaultKeyHeader, ""},
		{grpcidem.DefaultKeyHeader, long},
		{grpcidem.DefaultKeyHeader, "one", grpcidem.DefaultKeyHeader, "two"},
	} {
		a := e.call(testCtx(t), createMethod, "", order("book", 12), md...)
		if a.code() != codes.InvalidArgument || strings.Contains(a.err.Error(), long) || strings.Contains(a.err.Error(), "two") {
			t.Errorf("%q: %v, want InvalidArgument", md, a)
		}
	}
	// A value grpc-go's client refuses to send, given to the interceptor.
	in := grpcidem.UnaryServerInterceptor(e.m)
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(grpcidem.DefaultKeyHeader, "bad\x01key"))
	_, err := in(ctx, order("book", 12), &grpc.UnaryServerInfo{FullMethod: createMethod}, func(context.Context, any) (any, error) {
		t.Error("the handler ran")
		return nil, nil
	})
	if status.Code(err) != codes.InvalidArgument || strings.Contains(err.Error(), "bad\x01key") {
		t.Errorf("a control character: %v, want InvalidArgument", err)
	}
	if e.runs() != 0 {
		t.Errorf("the handler ran %d times", e.runs())
	}
	if a := e.call(testCtx(t), createMethod, strings.Repeat("k", idem.MaxKeyLen), order("book", 12)); a.err != nil {
		t.Errorf("a key of 255 bytes: %v", a)
	}
}

// TestWithoutKey: a call without a key passes through, every time;
// WithRequireKey refuses it with InvalidArgument.
func TestWithoutKey(t *testing.T) {
	e := start(t, setup{store: "memory", network: "bufconn"})
	for i := range 2 {
		if a := e.call(testCtx(t), createMethod, "", order("book", 12)); a.err != nil || a.replayed() || e.runs() != int64(i+1) {
			t.Errorf("call %d without a key: %v after %d runs", i+1, a, e.runs())
		}
	}
	r := start(t, setup{store: "memory", network: "bufconn", server: []grpcidem.Option{grpcidem.WithRequireKey()}})
	if a := r.call(testCtx(t), createMethod, "", order("book", 12)); a.code() != codes.InvalidArgument || r.runs() != 0 {
		t.Errorf("WithRequireKey: %v after %d runs, want InvalidArgument", a, r.runs())
	}
}

// TestScope: the same key from two principals is two records (the
// authorization metadata with AuthorizationScope, or another WithScope
// function; the default, the principal, is TestPrincipalScope...'s), and
// each principal's retry gets its own response.
func TestScope(t *testing.T) {
	handler := func(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		return wrapperspb.String("for " + strings.Join(md.Get("authorization"), ",") + strings.Join(md.Get("x-tenant"), ",")), nil
	}
	for _, c := range []struct {
		name   string
		opts   []grpcidem.Option
		header string
	}{
		{"authorization", []grpcidem.Option{grpcidem.WithScope(grpcidem.AuthorizationScope)}, "authorization"},
		{"WithScope", []grpcidem.Option{grpcidem.WithScope(func(ctx context.Context) string {
			return strings.Join(metadata.ValueFromIncomingContext(ctx, "x-tenant"), ",")
		})}, "x-tenant"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := start(t, setup{store: "memory", network: "bufconn", server: c.opts, handler: handler})
			key := "scope-" + randomHex()
			alice := e.call(testCtx(t), createMethod, key, order("book", 1), c.header, "alice")
			bob := e.call(testCtx(t), createMethod, key, order("book", 1), c.header, "bob")
			again := e.call(testCtx(t), createMethod, key, order("book", 1), c.header, "alice")
			if alice.replayed() || bob.replayed() || bytes.Equal(alice.raw, bob.raw) || e.runs() != 2 {
				t.Errorf("alice %v, bob %v after %d runs: want a run each", alice, bob, e.runs())
			}
			if !again.replayed() || !bytes.Equal(again.raw, alice.raw) {
				t.Errorf("alice's retry: %v, want her response", again)
			}
		})
	}
}

// TestWithMethods: WithMethods protects the methods it names only.
func TestWithMethods(t *testing.T) {
	e := start(t, setup{store: "memory", network: "bufconn", server: []grpcidem.Option{grpcidem.WithMethods(describeMethod)}})
	key := "methods-" + randomHex()
	for range 2 {
		e.call(testCtx(t), createMethod, key, order("book", 1))
	}
	if e.runs() != 2 {
		t.Errorf("an unnamed method ran %d times for 2 calls with one key", e.runs())
	}
	for range 2 {
		e.call(testCtx(t), describeMethod, key, order("book", 1))
	}
	if e.runs() != 3 {
		t.Errorf("the named method ran %d times for 2 calls with one key, want 1", e.runs()-2)
	}
}

// TestNotReplayable: a response larger than WithMaxReply,
// and one whose type is not registered, reach their first caller; the
// retry gets FailedPrecondition saying it completed, and the handler does
// not run again.
func TestNotReplayable(t *testing.T) {
	file := protodesc.ToFileDescriptorProto(wrapperspb.File_google_protobuf_wrappers_proto)
	unregistered := &descriptorpb.FileDescriptorProto{
		Name:        proto.String("test/unregistered.proto"),
		Package:     proto.String("test.unregistered"),
		Syntax:      proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{file.MessageType[0]}, // DoubleValue's shape
	}
	fd, err := protodesc.NewFile(unregistered, nil)
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamicpb.NewMessageType(fd.Messages().Get(0))
	handler := func(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
		if req.Fields["item"].GetStringValue() == "dynamic" {
			m := dyn.New()
			m.Set(m.Descriptor().Fields().Get(0), protoreflect.ValueOfFloat64(2.5))
			return m.Interface(), nil
		}
		return wrapperspb.String(strings.Repeat("x", 64)), nil
	}
	e := start(t, setup{store: "memory", network: "bufconn", handler: handler, server: []grpcidem.Option{grpcidem.WithMaxReply(48)}})
	for _, item := range []string{"large", "dynamic"} {
		t.Run(item, func(t *testing.T) {
			key := "kept-" + randomHex()
			before := e.runs()
			if a := e.call(testCtx(t), createMethod, key, order(item, 1)); a.err != nil || len(a.raw) == 0 {
				t.Fatalf("the first call: %v", a)
			}
			a := e.call(testCtx(t), createMethod, key, order(item, 1))
			if a.code() != codes.FailedPrecondition || !strings.Contains(status.Convert(a.err).Message(), "not kept") || e.runs()-before != 1 {
				t.Errorf("the retry: %v after %d runs, want FailedPrecondition and 1 run", a, e.runs()-before)
			}
		})
	}
}

// TestCanceledBeforeProcessing: a call whose context ended before the
// interceptor asked the store gets the context's code, Canceled or
// DeadlineExceeded; the handler does not run.
func TestCanceledBeforeProcessing(t *testing.T) {
	e := start(t, setup{store: "memory", network: "bufconn"})
	in := grpcidem.UnaryServerInterceptor(e.m)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for want, ctx := range map[codes.Code]context.Context{codes.Canceled: canceled, codes.DeadlineExceeded: expired} {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(grpcidem.DefaultKeyHeader, "canceled-"+randomHex()))
		_, err := in(ctx, order("book", 1), &grpc.UnaryServerInfo{FullMethod: createMethod}, func(context.Context, any) (any, error) {
			t.Error("the handler ran")
			return nil, nil
		})
		if status.Code(err) != want {
			t.Errorf("%v: want %v", err, want)
		}
	}
}

// TestUnreadableRecord: a record the store cannot give back whole, one
// that is not this package's, and one whose message type this program
// does not know, get Internal; the handler does not run.
func TestUnreadableRecord(t *testing.T) {
	var corrupt atomic.Bool
	e := start(t, setup{store: "memory", network: "bufconn", wrapStore: func(st storage.Store) storage.Store {
		return &corruptingStore{Store: st, on: &corrupt}
	}})
	req := order("book", 12)
	fp, _ := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	plant := func(record []byte) string {
		key := "planted-" + randomHex()
		if _, err := e.m.Do(context.Background(), createMethod, key, func(context.Context) ([]byte, error) { return record, nil }, idem.WithCallFingerprint(fp)); err != nil {
			t.Fatal(err)
		}
		return key
	}
	for name, key := range map[string]string{
		"not a record":    plant([]byte("not a record")),
		"unknown type":    plant(grpcidem.EncodeResponseRecord("test.v1.Unknown", nil, nil, nil)),
		"bad message":     plant(grpcidem.EncodeResponseRecord("google.protobuf.StringValue", []byte{0xff}, nil, nil)),
		"store corrupted": plant(grpcidem.EncodeResponseRecord("google.protobuf.StringValue", nil, nil, nil)),
	} {
		corrupt.Store(name == "store corrupted")
		if a := e.call(testCtx(t), createMethod, key, req); a.code() != codes.Internal || strings.Contains(a.err.Error(), key) {
			t.Errorf("%s: %v, want Internal", name, a)
		}
	}
	if e.runs() != 0 {
		t.Errorf("the handler ran %d times", e.runs())
	}
}

// corruptingStore flips a byte of every record it gives back while on is
// set.
type corruptingStore struct {
	storage.Store
	on *atomic.Bool
}

func (s *corruptingStore) Acquire(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
	res, err := s.Store.Acquire(ctx, key, owner, fp, lease)
	if err == nil && s.on.Load() && len(res.Record) > 0 {
		res.Record = bytes.Clone(res.Record)
		res.Record[len(res.Record)-1] ^= 0xff
	}
	return res, err
}

// TestHealthPassesThrough: grpc-go's health service, registered on the
// same server, is not disturbed: its unary Check passes through (no key),
// and its streaming Watch is never intercepted.
func TestHealthPassesThrough(t *testing.T) {
	e := start(t, setup{store: "memory", network: "tcp"})
	client := healthpb.NewHealthClient(e.conn)
	res, err := client.Check(testCtx(t), &healthpb.HealthCheckRequest{})
	if err != nil || res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check: %v, %v", res, err)
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	w, err := client.Watch(metadata.AppendToOutgoingContext(ctx, grpcidem.DefaultKeyHeader, "watch-"+randomHex()), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := w.Recv(); err != nil || res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Watch: %v, %v", res, err)
	}
	e.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	if res, err := w.Recv(); err != nil || res.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("Watch after the change: %v, %v", res, err)
	}
	cancel()
	for {
		if _, err := w.Recv(); err != nil {
			break
		}
	}
}

// TestObserverEvents: the middleware's observer sees a gRPC call's
// outcomes, its Route the full method name, its Method empty.
func TestObserverEvents(t *testing.T) {
	var mu sync.Mutex
	var events []idem.Event
	e := start(t, setup{store: "memory", network: "bufconn", idem: []idem.Option{idem.WithObserver(func(ev idem.Event) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	})}})
	key := "events-" + randomHex()
	e.call(testCtx(t), createMethod, key, order("book", 1))
	e.call(testCtx(t), createMethod, key, order("book", 1))
	e.call(testCtx(t), createMethod, key, order("book", 2))
	mu.Lock()
	defer mu.Unlock()
	want := []idem.Outcome{idem.Executed, idem.Replayed, idem.Mismatch}
	if len(events) != len(want) {
		t.Fatalf("%d events, want %d", len(events), len(want))
	}
	for i, ev := range events {
		if ev.Outcome != want[i] || ev.Route != createMethod || ev.Method != "" {
			t.Errorf("event %d: %v on %q %q, want %v on %q", i, ev.Outcome, ev.Method, ev.Route, want[i], createMethod)
		}
		if ev.Err != nil && strings.Contains(ev.Err.Error(), key) {
			t.Errorf("event %d holds the key: %v", i, ev.Err)
		}
	}
}

// TestHandlerSeesInfo: the handler's context carries the key's idem.Info,
// protected, as a request's does.
func TestHandlerSeesInfo(t *testing.T) {
	infos := make(chan idem.Info, 1)
	e := start(t, setup{store: "memory", network: "bufconn", handler: func(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
		info, _ := idem.FromContext(ctx)
		infos <- info
		return req, nil
	}})
	key := "info-" + randomHex()
	e.call(testCtx(t), createMethod, key, order("book", 1))
	if info := within(t, infos, "the handler"); info.Key != key || !info.Protected || info.Owner == "" {
		t.Errorf("Info %+v, want the key, protected, an owner", info)
	}
}
