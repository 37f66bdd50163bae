// Command testserver is the server of grpcidem's process tests
// (kill_test.go): the test service test.v1.Orders, its method Create
// behind grpcidem's interceptor, on a real Redis. It prints "listening on
// HOST:PORT" once it serves. Its handler counts its runs in Redis (INCR
// PREFIX+"runs") and answers "run N by PID"; with -hold it never returns
// after counting, so that a test can kill the process while it holds the
// key.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/grpcidem"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func main() {
	redisAddr := flag.String("redis", "localhost:6379", "Redis address")
	prefix := flag.String("prefix", "grpcidem-testserver:", "prefix of the store's keys and of the run counter")
	lease := flag.Duration("lease", time.Second, "the middleware's lease")
	hold := flag.Bool("hold", false, "hold every call after counting its run, never answering")
	flag.Parse()
	log.SetFlags(0)

	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr})
	m, err := idem.New(redisstore.New(rdb, redisstore.WithPrefix(*prefix)), idem.WithLease(*lease))
	if err != nil {
		log.Fatal(err)
	}
	s := &server{rdb: rdb, counter: *prefix + "runs", hold: *hold}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(grpcidem.UnaryServerInterceptor(m)))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "test.v1.Orders",
		HandlerType: (*any)(nil),
		Methods:     []grpc.MethodDesc{{MethodName: "Create", Handler: s.create}},
	}, s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("listening on %s\n", ln.Addr())
	log.Fatal(srv.Serve(ln))
}

// server is the test service.
type server struct {
	rdb     *redis.Client
	counter string
	hold    bool
}

// create is the method handler of /test.v1.Orders/Create.
func (s *server) create(_ any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
	req := new(structpb.Struct)
	if err := dec(req); err != nil {
		return nil, err
	}
	return in(ctx, req, &grpc.UnaryServerInfo{Server: s, FullMethod: "/test.v1.Orders/Create"}, func(ctx context.Context, _ any) (any, error) {
		n, err := s.rdb.Incr(context.WithoutCancel(ctx), s.counter).Result()
		if err != nil {
			return nil, err
		}
		if s.hold {
			select {} // until the test kills the process
		}
		return wrapperspb.String(fmt.Sprintf("run %d by %d", n, os.Getpid())), nil
	})
}
