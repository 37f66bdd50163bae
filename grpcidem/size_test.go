package grpcidem_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/grpcidem"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// bigHandler answers a reply of the request's "size" bytes.
func bigHandler(_ context.Context, req *structpb.Struct) (proto.Message, error) {
	return wrapperspb.Bytes(bytes.Repeat([]byte{'x'}, int(req.Fields["size"].GetNumberValue()))), nil
}

// sized returns a request for a reply of n bytes.
func sized(n int) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{"size": structpb.NewNumberValue(float64(n))}}
}

// TestReplySize: by default a reply of 2 MiB, which gRPC's clients
// receive by default (up to 4 MiB), is kept and replayed byte for byte,
// whatever the core's HTTP response limit (1 MiB by default); a reply
// larger than WithMaxReply reaches its caller, and the retry gets the
// not-replayable refusal, the handler run once.
func TestReplySize(t *testing.T) {
	stores(t, func(t *testing.T, s setup) {
		s.handler = bigHandler
		e := start(t, s)
		key := "big-" + randomHex()
		first := e.call(testCtx(t), createMethod, key, sized(2<<20))
		if first.err != nil || len(first.raw) < 2<<20 {
			t.Fatalf("the first call: %v", first)
		}
		again := e.call(testCtx(t), createMethod, key, sized(2<<20))
		if again.err != nil || !again.replayed() || !bytes.Equal(again.raw, first.raw) || e.runs() != 1 {
			t.Errorf("the retry of a 2 MiB reply: %v after %d runs, want it replayed byte for byte", again, e.runs())
		}
	})
}

// TestWithMaxReply: a reply within WithMaxReply is replayed; one over it
// reaches its caller, and the retry gets FailedPrecondition,
// ReasonNotReplayable; the handler ran once for each.
func TestWithMaxReply(t *testing.T) {
	e := start(t, setup{store: "memory", network: "bufconn", handler: bigHandler, server: []grpcidem.Option{grpcidem.WithMaxReply(64 << 10)}})
	for _, c := range []struct {
		size int
		kept bool
	}{{60 << 10, true}, {65 << 10, false}} {
		key := "max-" + randomHex()
		before := e.runs()
		if a := e.call(testCtx(t), createMethod, key, sized(c.size)); a.err != nil || len(a.raw) < c.size {
			t.Fatalf("%d bytes, the first call: %v", c.size, a)
		}
		a := e.call(testCtx(t), createMethod, key, sized(c.size))
		switch {
		case e.runs()-before != 1:
			t.Errorf("%d bytes: the handler ran %d times, want 1", c.size, e.runs()-before)
		case c.kept && (a.err != nil || !a.replayed()):
			t.Errorf("%d bytes, the retry: %v, want the replay", c.size, a)
		case !c.kept && (a.code() != codes.FailedPrecondition || grpcidem.Reason(a.err) != grpcidem.ReasonNotReplayable || !strings.Contains(a.err.Error(), "not kept")):
			t.Errorf("%d bytes, the retry: %v, want FailedPrecondition, %s", c.size, a, grpcidem.ReasonNotReplayable)
		}
	}
}

// TestNilReply: a handler that returns neither a reply nor an error
// completed; grpc-go sends its caller an empty message (OK, no bytes),
// and a retry gets the same, replayed, without a second run.
func TestNilReply(t *testing.T) {
	e := start(t, setup{store: "memory", network: "bufconn", handler: func(context.Context, *structpb.Struct) (proto.Message, error) {
		return nil, nil
	}})
	key := "nil-" + randomHex()
	first := e.call(testCtx(t), createMethod, key, order("book", 1))
	if first.err != nil || len(first.raw) != 0 || first.replayed() {
		t.Errorf("the first call: %v, want OK and an empty message, as grpc-go sends a nil reply", first)
	}
	again := e.call(testCtx(t), createMethod, key, order("book", 1))
	if again.err != nil || len(again.raw) != 0 || !again.replayed() || e.runs() != 1 {
		t.Errorf("the retry: %v after %d runs, want the same empty message replayed, 1 run", again, e.runs())
	}
	var typed wrapperspb.StringValue // the method's own reply type decodes it
	if err := e.conn.Invoke(metadata.AppendToOutgoingContext(testCtx(t), grpcidem.DefaultKeyHeader, key), createMethod, order("book", 1), &typed); err != nil || typed.GetValue() != "" {
		t.Errorf("the retry into the reply's type: %v, %v", &typed, err)
	}
}

// TestRootRequestOptionsIgnored: one Middleware may serve HTTP and gRPC;
// its options of HTTP requests do not apply to gRPC calls, whose
// interceptor has its own twins: idem.WithRequireKey (a call without a
// key still passes), WithHeader (the key is still idempotency-key),
// WithMethods and WithCacheable (the call is still protected and stored),
// WithoutFingerprint (another request is still refused) and
// WithMaxResponseBody (a reply larger still is kept).
func TestRootRequestOptionsIgnored(t *testing.T) {
	e := start(t, setup{store: "memory", network: "bufconn", handler: bigHandler, idem: []idem.Option{
		idem.WithRequireKey(), idem.WithHeader("X-Key"), idem.WithMethods("PUT"),
		idem.WithCacheable(func(int) bool { return false }), idem.WithoutFingerprint(), idem.WithMaxResponseBody(16),
	}})
	if a := e.call(testCtx(t), createMethod, "", sized(64)); a.err != nil {
		t.Errorf("a call without a key: %v, want it to pass", a)
	}
	key := "root-" + randomHex()
	e.call(testCtx(t), createMethod, key, sized(64))
	if a := e.call(testCtx(t), createMethod, key, sized(64)); a.err != nil || !a.replayed() || len(a.raw) < 64 {
		t.Errorf("the retry: %v, want a replay of 64 bytes", a)
	}
	if a := e.call(testCtx(t), createMethod, key, sized(65)); grpcidem.Reason(a.err) != grpcidem.ReasonMismatch {
		t.Errorf("another request: %v, want %s", a, grpcidem.ReasonMismatch)
	}
	if e.runs() != 2 {
		t.Errorf("the handler ran %d times, want 2", e.runs())
	}
}
