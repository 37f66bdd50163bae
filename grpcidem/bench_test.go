package grpcidem_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/idemkit/idem/grpcidem"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// BenchmarkUnary measures what the server interceptor adds to a unary
// call over bufconn, on the memory store: each iteration is one call of
// test.v1.Orders/Create (a small Struct request, a StringValue response),
// client and server in the process (the allocations counted are both
// sides'). The handler sets one header entry.
//
//	bare      no interceptor but the recovery one
//	bare-key  the same, the call carrying a key: the key's own cost on the
//	          wire and in both sides' metadata
//	no-key    the interceptor, the call without a key: passes through
//	first     the interceptor, a new key per call: the handler runs
//	replay    the interceptor, one key: the stored response is replayed
//	client    no server interceptor; the client interceptor on the
//	          connection, a key generated per call: the client's cost
//
//	go test -run '^$' -bench BenchmarkUnary -benchmem -count 6 ./grpcidem/
func BenchmarkUnary(b *testing.B) {
	for _, c := range []struct {
		name        string
		intercepted bool
		key         func(i int) string
		client      bool
	}{
		{"bare", false, nil, false},
		{"bare-key", false, func(i int) string { return "bench-bare-" + strconv.Itoa(i) }, false},
		{"no-key", true, nil, false},
		{"first", true, func(i int) string { return "bench-first-" + strconv.Itoa(i) }, false},
		{"replay", true, func(int) string { return "bench-replay" }, false},
		{"client", false, nil, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			e := benchEnv(b, c.intercepted, c.client)
			req := order("book", 12)
			ctx := context.Background()
			var resp wrapperspb.StringValue
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				cctx := ctx
				if c.key != nil {
					cctx = metadata.AppendToOutgoingContext(ctx, "idempotency-key", c.key(i))
				}
				if err := e.conn.Invoke(cctx, createMethod, req, &resp); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// benchEnv serves the benchmarks' handler on the memory store over
// bufconn, with grpcidem's interceptor when intercepted, and connects to
// it, with grpcidem's client interceptor when client.
func benchEnv(b *testing.B, intercepted, client bool) *env {
	s := setup{store: "memory", network: "bufconn", bare: !intercepted, handler: func(ctx context.Context, _ *structpb.Struct) (proto.Message, error) {
		grpc.SetHeader(ctx, metadata.Pairs("x-order-id", "1"))
		return wrapperspb.String("order 1"), nil
	}}
	if client {
		s.dial = []grpc.DialOption{grpc.WithChainUnaryInterceptor(grpcidem.UnaryClientInterceptor())}
	}
	return start(b, s)
}
