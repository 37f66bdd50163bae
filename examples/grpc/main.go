// Command grpc serves an order service over gRPC, protected by grpcidem: a
// call that carries an idempotency-key runs once, and every retry gets its
// answer again, marked idempotent-replayed: true.
//
//	go run ./examples/grpc                     # serve on localhost:50051, memory store
//	go run ./examples/grpc -redis localhost:6379
//	go run ./examples/grpc -demo               # serve on a free port, run a scripted client against it, exit
//
// The service, orders.v1.Orders, has one method, Create, which takes an
// order as a google.protobuf.Struct ({"item": "book", "amount": 12}) and
// answers it numbered, with its number in the order-id header too: no
// .proto file, no generated code. -demo runs a client with grpcidem's
// client interceptor (one key per call, kept across its retries) and
// prints what each call got; it exits 1 if an answer is not the promised
// one.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/grpcidem"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

func main() {
	addr := flag.String("addr", "localhost:50051", "listen address")
	redisAddr := flag.String("redis", "", "Redis address (host:port); default: the in-memory store")
	demo := flag.Bool("demo", false, "serve on a free port, run a scripted client against it, and exit")
	flag.Parse()
	log.SetFlags(0)
	if err := run(*addr, *redisAddr, *demo, os.Stdout, os.Stderr); err != nil {
		log.Fatal(err)
	}
}

// run serves until SIGINT or SIGTERM (with demo, on a free port while the
// demo runs, printing its transcript to out), logging idem's decisions to
// logTo, then shuts down in the order a deploy needs.
func run(addr, redisAddr string, demo bool, out, logTo io.Writer) error {
	var store storage.Store
	if redisAddr == "" {
		ms := memstore.New()
		defer ms.Close() // 3. the store, last
		store = ms
	} else {
		rdb := redis.NewClient(redisstore.ClientOptions(redisAddr))
		defer rdb.Close()
		store = redisstore.New(rdb)
	}
	m, err := idem.New(store, idem.WithObserver(func(ev idem.Event) {
		fmt.Fprintf(logTo, "idem: %s -> %s (%v)\n", ev.Route, ev.Outcome, ev.Duration.Round(time.Microsecond))
	}))
	if err != nil {
		return err
	}
	// Recovery outside idem's interceptor: a panic releases the key first.
	// A service that authenticates puts its interceptor before grpcidem's
	// too, and names the principal the records are scoped by, once it has
	// verified the token: ctx = idem.ContextWithPrincipal(ctx, subject).
	// This demo has no credentials: its calls share the anonymous scope
	// (a call with authorization metadata and no principal is refused).
	chain := []grpc.UnaryServerInterceptor{recoverPanics(logTo), grpcidem.UnaryServerInterceptor(m)}
	var d *demoClient
	if demo {
		addr = "127.0.0.1:0"
		d = newDemoClient()
		chain = append(chain, d.hold) // holds the double call's first call (demo.go)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(chain...))
	srv.RegisterService(&ordersService, &orders{})
	healthpb.RegisterHealthServer(srv, health.NewServer()) // not intercepted: no key
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	go srv.Serve(ln)

	var failed error
	if demo {
		failed = d.play(out, ln.Addr().String())
	} else {
		log.Printf("listening on %s (gRPC, plaintext); orders.v1.Orders/Create takes idempotency-key metadata", ln.Addr())
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		<-ctx.Done()
		stop()
	}
	// 1. the server: no new call, the handlers return; 2. idem: every
	// record stored, background retries included; 3. the store (deferred).
	srv.GracefulStop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return errors.Join(failed, m.Shutdown(ctx))
}

// createMethod is the full name of the service's one method.
const createMethod = "/orders.v1.Orders/Create"

// ordersService describes orders.v1.Orders, as generated code would: its
// method takes and returns a google.protobuf.Struct.
var ordersService = grpc.ServiceDesc{
	ServiceName: "orders.v1.Orders",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Create",
		Handler: func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			req := new(structpb.Struct)
			if err := dec(req); err != nil {
				return nil, err
			}
			create := func(ctx context.Context, req any) (any, error) {
				return srv.(*orders).create(ctx, req.(*structpb.Struct))
			}
			if in == nil {
				return create(ctx, req)
			}
			return in(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: createMethod}, create)
		},
	}},
}

// orders creates orders, numbered.
type orders struct{ n atomic.Int64 }

// create answers an order with its number; handler_runs counts the
// handler's runs. An order without an item or amount gets
// InvalidArgument, which idem stores: a retry gets it again.
func (o *orders) create(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	item, amount := in.Fields["item"].GetStringValue(), in.Fields["amount"].GetNumberValue()
	if item == "" || amount <= 0 {
		return nil, status.Error(codes.InvalidArgument, "an order needs an item and a positive amount")
	}
	n := o.n.Add(1)
	grpc.SetHeader(ctx, metadata.Pairs("order-id", strconv.FormatInt(n, 10)))
	return structpb.NewStruct(map[string]any{"order": n, "item": item, "amount": amount, "handler_runs": n})
}

// recoverPanics turns a handler's panic into Internal, logging it.
func recoverPanics(logTo io.Writer) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				fmt.Fprintf(logTo, "panic in %s: %v\n", info.FullMethod, p)
				resp, err = nil, status.Error(codes.Internal, "internal error")
			}
		}()
		return h(ctx, req)
	}
}
