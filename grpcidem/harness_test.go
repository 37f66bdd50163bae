package grpcidem_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/grpcidem"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The test service, registered by hand (no generated code): test.v1.Orders
// with two unary methods taking a google.protobuf.Struct. Create answers
// a message of the handler's choice (the tests use messages without maps,
// whose bytes a replay must give again), Describe a Struct (a map).
const (
	createMethod   = "/test.v1.Orders/Create"
	describeMethod = "/test.v1.Orders/Describe"
)

// handlerFunc is a test's handler of both methods.
type handlerFunc func(ctx context.Context, req *structpb.Struct) (proto.Message, error)

// ordersDesc describes test.v1.Orders; the server's implementation is a
// *service.
var ordersDesc = grpc.ServiceDesc{
	ServiceName: "test.v1.Orders",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Create", Handler: unary(createMethod)},
		{MethodName: "Describe", Handler: unary(describeMethod)},
	},
	Metadata: "test/v1/orders.proto",
}

// unary returns the method handler of fullMethod, as generated code
// would: decode the request, run the interceptors, call the service.
func unary(fullMethod string) func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
	return func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
		req := new(structpb.Struct)
		if err := dec(req); err != nil {
			return nil, err
		}
		s := srv.(*service)
		h := func(ctx context.Context, req any) (any, error) { return s.handle(ctx, req.(*structpb.Struct)) }
		if in == nil {
			return h(ctx, req)
		}
		return in(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: fullMethod}, h)
	}
}

// service counts the runs of its handler.
type service struct {
	runs    atomic.Int64
	handler handlerFunc
}

func (s *service) handle(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
	s.runs.Add(1)
	return s.handler(ctx, req)
}

// recoverPanics is the recovery interceptor outside idem's: a panic
// becomes Internal.
func recoverPanics(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			resp, err = nil, status.Errorf(codes.Internal, "panic: %v", p)
		}
	}()
	return h(ctx, req)
}

// setup says how a test environment is built.
type setup struct {
	store     string // "memory" or "redis"
	network   string // "bufconn" or "tcp"
	idem      []idem.Option
	server    []grpcidem.Option
	dial      []grpc.DialOption
	wrapStore func(storage.Store) storage.Store
	handler   handlerFunc
	bare      bool // no grpcidem interceptor: the benchmarks' baseline
}

// env is a server with the interceptor, its store and a client connection.
type env struct {
	t      testing.TB
	store  storage.Store // as the middleware got it
	m      *idem.Middleware
	srv    *grpc.Server
	svc    *service
	conn   *grpc.ClientConn
	addr   string // "host:port" on tcp
	health *health.Server

	stopOnce sync.Once
}

// matrix runs f for each store and network: memory and Redis, bufconn and
// loopback TCP.
func matrix(t *testing.T, f func(t *testing.T, s setup)) {
	for _, st := range []string{"memory", "redis"} {
		for _, nw := range []string{"bufconn", "tcp"} {
			t.Run(st+"/"+nw, func(t *testing.T) { f(t, setup{store: st, network: nw}) })
		}
	}
}

// stores runs f for each store, on bufconn.
func stores(t *testing.T, f func(t *testing.T, s setup)) {
	for _, st := range []string{"memory", "redis"} {
		t.Run(st, func(t *testing.T) { f(t, setup{store: st, network: "bufconn"}) })
	}
}

// newStore returns a store of kind ("memory", or "redis": a real
// redis-server, with a prefix of the test's own).
func newStore(t testing.TB, kind string) storage.Store {
	switch kind {
	case "memory":
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s
	case "redis":
		rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
		t.Cleanup(func() { rdb.Close() })
		return redisstore.New(rdb, redisstore.WithPrefix("grpcidem-test:"+randomHex()+":"))
	}
	t.Fatalf("no store %q", kind)
	return nil
}

// randomHex returns 8 random hex digits.
func randomHex() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// start builds s's environment: a store, a middleware, a server with the
// recovery interceptor and grpcidem's (and, on TCP, grpc-go's health
// service), and a connection to it. Everything stops when the test ends.
func start(t testing.TB, s setup) *env {
	t.Helper()
	store := newStore(t, s.store)
	if s.wrapStore != nil {
		store = s.wrapStore(store)
	}
	return startOn(t, s, store)
}

// startOn builds s's environment on store.
func startOn(t testing.TB, s setup, store storage.Store) *env {
	t.Helper()
	m, err := idem.New(store, s.idem...)
	if err != nil {
		t.Fatal(err)
	}
	h := s.handler
	if h == nil {
		h = okHandler
	}
	e := &env{t: t, store: store, m: m, svc: &service{handler: h}}
	chain := []grpc.UnaryServerInterceptor{recoverPanics}
	if !s.bare {
		chain = append(chain, grpcidem.UnaryServerInterceptor(m, s.server...))
	}
	e.srv = grpc.NewServer(grpc.ChainUnaryInterceptor(chain...))
	e.srv.RegisterService(&ordersDesc, e.svc)
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, s.dial...)
	target := ""
	switch s.network {
	case "bufconn":
		lis := bufconn.Listen(1 << 20)
		go e.srv.Serve(lis)
		target = "passthrough:///bufconn"
		dial = append(dial, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	case "tcp":
		e.health = health.NewServer()
		healthpb.RegisterHealthServer(e.srv, e.health)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go e.srv.Serve(lis)
		e.addr = lis.Addr().String()
		target = "passthrough:///" + e.addr
	default:
		t.Fatalf("no network %q", s.network)
	}
	e.conn, err = grpc.NewClient(target, dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.stop)
	return e
}

// stop closes the connection, stops the server and shuts the middleware
// down, in that order; once.
func (e *env) stop() {
	e.stopOnce.Do(func() {
		e.conn.Close()
		e.srv.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.m.Shutdown(ctx); err != nil {
			e.t.Errorf("Shutdown: %v", err)
		}
	})
}

// runs returns how often the handler ran.
func (e *env) runs() int64 { return e.svc.runs.Load() }

// answer is what a call got.
type answer struct {
	raw             []byte // the response message's bytes, as received
	header, trailer metadata.MD
	err             error
}

// code returns the answer's status code.
func (a answer) code() codes.Code { return status.Code(a.err) }

// replayed reports whether the answer is marked as a replay.
func (a answer) replayed() bool {
	vs := a.header.Get(grpcidem.ReplayedHeader)
	return len(vs) == 1 && vs[0] == "true"
}

// String describes the answer for failure messages.
func (a answer) String() string {
	return fmt.Sprintf("{code %v, err %v, %d bytes, header %v, trailer %v}", a.code(), a.err, len(a.raw), a.header, a.trailer)
}

// call sends req to method with key ("" for none) on the connection,
// with extra metadata pairs, and returns what it got; the response's bytes
// are kept as they came.
func (e *env) call(ctx context.Context, method, key string, req *structpb.Struct, md ...string) answer {
	return callOn(ctx, e.conn, method, key, req, md...)
}

// callOn is call on any connection.
func callOn(ctx context.Context, conn *grpc.ClientConn, method, key string, req *structpb.Struct, md ...string) answer {
	if key != "" {
		md = append(md, grpcidem.DefaultKeyHeader, key)
	}
	if len(md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
	}
	var a answer
	var raw rawMessage
	a.err = conn.Invoke(ctx, method, req, &raw, grpc.Header(&a.header), grpc.Trailer(&a.trailer), grpc.ForceCodecV2(rawCodec{}))
	a.raw = raw
	return a
}

// rawMessage is a response kept as its bytes.
type rawMessage []byte

// rawCodec is the client's proto codec, but it keeps responses as their
// bytes (into a *rawMessage).
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := proto.Marshal(v.(proto.Message))
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	raw, ok := v.(*rawMessage)
	if !ok {
		return proto.Unmarshal(data.Materialize(), v.(proto.Message))
	}
	*raw = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// order returns a request: an order of item for amount.
func order(item string, amount float64) *structpb.Struct {
	s, err := structpb.NewStruct(map[string]any{"item": item, "amount": amount})
	if err != nil {
		panic(err)
	}
	return s
}

// okHandler, the default handler, describes the order in a StringValue
// (a message without maps: its bytes are the same on every marshal).
func okHandler(_ context.Context, req *structpb.Struct) (proto.Message, error) {
	return wrapperspb.String(fmt.Sprintf("%s x %v", req.Fields["item"].GetStringValue(), req.Fields["amount"].GetNumberValue())), nil
}

// ctx returns a context for one call, ended with the test (at most 30 s).
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// retryInfo returns the RetryInfo delay of err's status, or 0.
func retryInfo(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// failingStore is a store whose Acquire fails while down is set.
type failingStore struct {
	storage.Store
	down atomic.Bool
}

var errDown = errors.New("test: store down")

func (s *failingStore) Acquire(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
	if s.down.Load() {
		return storage.Result{}, errDown
	}
	return s.Store.Acquire(ctx, key, owner, fp, lease)
}

// within waits for ch to deliver, at most 10 s, and fails the test
// otherwise.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	tm := time.NewTimer(10 * time.Second)
	defer tm.Stop()
	select {
	case v := <-ch:
		return v
	case <-tm.C:
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}
