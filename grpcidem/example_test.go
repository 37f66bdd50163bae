package grpcidem_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/grpcidem"
	"github.com/idemkit/idem/storage/memstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"
)

// createOrder is the handler of the examples' /orders.v1.Orders/Create:
// it numbers the orders. fail, when it returns true, makes a run fail
// with Unavailable (a database hiccup) instead.
func createOrder(runs *atomic.Int64, fail func(run int64) bool) func(context.Context, *structpb.Struct) (*structpb.Struct, error) {
	return func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		n := runs.Add(1)
		if fail != nil && fail(n) {
			return nil, status.Error(codes.Unavailable, "database hiccup")
		}
		grpc.SetHeader(ctx, metadata.Pairs("x-order-id", fmt.Sprint(n)))
		return structpb.NewStruct(map[string]any{"order": n, "item": in.Fields["item"].GetStringValue()})
	}
}

// serveOrders serves /orders.v1.Orders/Create with create, behind the
// server interceptors, in memory (bufconn), and returns a connection to it
// with the client interceptors, and a function that stops everything.
func serveOrders(create func(context.Context, *structpb.Struct) (*structpb.Struct, error), server []grpc.UnaryServerInterceptor, client ...grpc.UnaryClientInterceptor) (*grpc.ClientConn, func()) {
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(server...))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "orders.v1.Orders",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Create", Handler: func(_ any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			req := new(structpb.Struct)
			if err := dec(req); err != nil {
				return nil, err
			}
			info := &grpc.UnaryServerInfo{FullMethod: "/orders.v1.Orders/Create"}
			return in(ctx, req, info, func(ctx context.Context, req any) (any, error) { return create(ctx, req.(*structpb.Struct)) })
		}}},
	}, nil)
	lis := bufconn.Listen(1 << 20)
	go srv.Serve(lis)
	conn, err := grpc.NewClient("passthrough:///orders",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithChainUnaryInterceptor(client...))
	if err != nil {
		log.Fatal(err)
	}
	return conn, func() { conn.Close(); srv.GracefulStop() }
}

func ExampleUnaryServerInterceptor() {
	store := memstore.New() // or redisstore.New(rdb), shared by every instance
	defer store.Close()
	m, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	var runs atomic.Int64
	conn, stop := serveOrders(createOrder(&runs, nil), []grpc.UnaryServerInterceptor{grpcidem.UnaryServerInterceptor(m)})
	defer m.Shutdown(context.Background()) // after the server: every record stored
	defer stop()

	// A client retries a call with the same key: the handler ran once.
	ctx := metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", "order-7d3f09a2")
	for range 2 {
		var resp structpb.Struct
		var header metadata.MD
		err := conn.Invoke(ctx, "/orders.v1.Orders/Create", &structpb.Struct{Fields: map[string]*structpb.Value{
			"item": structpb.NewStringValue("book"),
		}}, &resp, grpc.Header(&header))
		fmt.Println(resp.Fields["order"].GetNumberValue(), header.Get("x-order-id"), header.Get("idempotent-replayed"), err)
	}
	// The same key for another order: refused.
	err = conn.Invoke(ctx, "/orders.v1.Orders/Create", &structpb.Struct{Fields: map[string]*structpb.Value{
		"item": structpb.NewStringValue("pen"),
	}}, new(structpb.Struct))
	fmt.Println(status.Code(err), "handler runs:", runs.Load())
	// Output:
	// 1 [1] [] <nil>
	// 1 [1] [true] <nil>
	// FailedPrecondition handler runs: 1
}

func ExampleUnaryClientInterceptor() {
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	var runs atomic.Int64
	// The first run fails with Unavailable, which releases the key.
	create := createOrder(&runs, func(run int64) bool { return run == 1 })
	client := grpcidem.UnaryClientInterceptor(
		grpcidem.WithBackoff(10*time.Millisecond, 100*time.Millisecond),
		grpcidem.WithAttemptHook(func(a grpcidem.Attempt) {
			// A log line or a metric; the key is never in an Attempt.
			fmt.Printf("attempt %d of %s: %v retry=%v\n", a.N, a.Method, a.Code, a.Retry)
		}),
	)
	conn, stop := serveOrders(create, []grpc.UnaryServerInterceptor{grpcidem.UnaryServerInterceptor(m)}, client)
	defer m.Shutdown(context.Background())
	defer stop()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // bounds the attempts and waits too
	defer cancel()
	var resp structpb.Struct
	err = conn.Invoke(ctx, "/orders.v1.Orders/Create", &structpb.Struct{Fields: map[string]*structpb.Value{
		"item": structpb.NewStringValue("book"),
	}}, &resp)
	if err != nil {
		log.Fatal(err) // it may have run once, never twice
	}
	fmt.Println("order", resp.Fields["order"].GetNumberValue(), "handler runs:", runs.Load())
	// Output:
	// attempt 1 of /orders.v1.Orders/Create: Unavailable retry=true
	// attempt 2 of /orders.v1.Orders/Create: OK retry=false
	// order 2 handler runs: 2
}

func ExampleWithStoredCodes() {
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	var runs atomic.Int64
	// Every run fails with Unavailable; this service says a retry must
	// not run it again (the hiccup may have taken effect), so Unavailable
	// is stored too.
	create := createOrder(&runs, func(int64) bool { return true })
	in := grpcidem.UnaryServerInterceptor(m, grpcidem.WithStoredCodes(func(c codes.Code) bool {
		return c == codes.Unavailable || grpcidem.DefaultStored(c)
	}))
	conn, stop := serveOrders(create, []grpc.UnaryServerInterceptor{in})
	defer m.Shutdown(context.Background())
	defer stop()

	ctx := metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", "order-1")
	for range 2 {
		var header metadata.MD
		err := conn.Invoke(ctx, "/orders.v1.Orders/Create", &structpb.Struct{}, new(structpb.Struct), grpc.Header(&header))
		fmt.Println(status.Code(err), header.Get("idempotent-replayed"))
	}
	fmt.Println("handler runs:", runs.Load())
	// Output:
	// Unavailable []
	// Unavailable [true]
	// handler runs: 1
}
