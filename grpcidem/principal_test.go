package grpcidem_test

import (
	"context"

	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/grpcidem"
	"github.com/idemkit/idem/storage/memstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// minting is per-call credentials that mint a new access token for every
// call, as an OAuth token source that refreshes does: "Bearer user.n".
type minting struct {
	user string
	n    atomic.Int64
}

func (c *minting) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": fmt.Sprintf("Bearer %s.%d", c.user, c.n.Add(1))}, nil
}

func (*minting) RequireTransportSecurity() bool { return false }

// authenticate is a service's authentication interceptor: it verifies the
// token (here: a known user's) and names its subject as the principal.
func authenticate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	token, _ := strings.CutPrefix(strings.Join(metadata.ValueFromIncomingContext(ctx, "authorization"), ""), "Bearer ")
	user, _, _ := strings.Cut(token, ".")
	if user != "alice" && user != "bob" {
		return nil, status.Error(codes.Unauthenticated, "unknown token")
	}
	return h(idem.ContextWithPrincipal(ctx, user), req)
}

// principalEnv is a server with the interceptors before it (the
// authentication, say) and grpcidem's, on bufconn; dial makes a
// connection to it with the options given.
type principalEnv struct {
	svc  *service
	dial func(opts ...grpc.DialOption) *grpc.ClientConn
}

func startPrincipal(t *testing.T, before []grpc.UnaryServerInterceptor, opts ...grpcidem.Option) *principalEnv {
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	m, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	e := &principalEnv{svc: &service{handler: func(ctx context.Context, _ *structpb.Struct) (proto.Message, error) {
		p, _ := idem.PrincipalFromContext(ctx)
		return wrapperspb.String("for " + p), nil
	}}}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(append(before, grpcidem.UnaryServerInterceptor(m, opts...))...))
	srv.RegisterService(&ordersDesc, e.svc)
	lis := bufconn.Listen(1 << 20)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	e.dial = func(opts ...grpc.DialOption) *grpc.ClientConn {
		conn, err := grpc.NewClient("passthrough:///bufconn", append([]grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	return e
}

// A client whose per-call credentials mint a new token for every call
// stays in its scope under the default: the principal that the
// authentication interceptor, before grpcidem's, named. The retry with
// the new token is a replay, and the handler runs once; another principal
// with the same key and request runs its own call and never gets the
// first's response.
func TestPrincipalScopeSurvivesPerCallTokens(t *testing.T) {
	e := startPrincipal(t, []grpc.UnaryServerInterceptor{authenticate})
	alice := e.dial(grpc.WithPerRPCCredentials(&minting{user: "alice"}))
	bob := e.dial(grpc.WithPerRPCCredentials(&minting{user: "bob"}))
	first := callOn(testCtx(t), alice, createMethod, "k", order("book", 1))
	retry := callOn(testCtx(t), alice, createMethod, "k", order("book", 1))
	if first.err != nil || first.replayed() || retry.err != nil || !retry.replayed() || string(retry.raw) != string(first.raw) {
		t.Fatalf("alice: %v then %v, want a run then its replay", first, retry)
	}
	if n := e.svc.runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times for alice's one call, want 1", n)
	}
	other := callOn(testCtx(t), bob, createMethod, "k", order("book", 1))
	if other.err != nil || other.replayed() || !strings.Contains(string(other.raw), "for bob") || e.svc.runs.Load() != 2 {
		t.Fatalf("bob with alice's key and request: %v %q after %d runs, want his own run", other, other.raw, e.svc.runs.Load())
	}
	if again := callOn(testCtx(t), bob, createMethod, "k", order("book", 1)); !again.replayed() || string(again.raw) != string(other.raw) {
		t.Fatalf("bob's retry: %v, want his own response", again)
	}
}

// Authorization metadata and no principal, under the default scope: the
// call is refused, Internal (the service is misconfigured), and the
// handler does not run. A call without credentials is anonymous, as
// before; WithScope(AuthorizationScope) keeps the old scope, the metadata
// whole, where a new token is a new scope.
func TestScopeUnknownRefused(t *testing.T) {
	e := startPrincipal(t, nil)
	minted := e.dial(grpc.WithPerRPCCredentials(&minting{user: "alice"}))
	a := callOn(testCtx(t), minted, createMethod, "k", order("book", 1))
	if a.code() != codes.Internal || grpcidem.Reason(a.err) != grpcidem.ReasonScopeUnknown || e.svc.runs.Load() != 0 {
		t.Fatalf("credentials without a principal: %v (reason %q) after %d runs, want Internal, %s and no run", a, grpcidem.Reason(a.err), e.svc.runs.Load(), grpcidem.ReasonScopeUnknown)
	}
	if msg := status.Convert(a.err).Message(); !strings.Contains(msg, "idem.ContextWithPrincipal") || !strings.Contains(msg, "grpcidem.WithScope") {
		t.Fatalf("the refusal says %q: it must say what to do", msg)
	}
	if a := callOn(testCtx(t), e.dial(), createMethod, "k", order("book", 1)); a.err != nil || e.svc.runs.Load() != 1 {
		t.Fatalf("anonymous: %v after %d runs", a, e.svc.runs.Load())
	}
	if a := callOn(testCtx(t), minted, createMethod, "", order("book", 1)); a.err != nil || e.svc.runs.Load() != 2 {
		t.Fatalf("no key: %v after %d runs: not protected, not refused", a, e.svc.runs.Load())
	}

	old := startPrincipal(t, nil, grpcidem.WithScope(grpcidem.AuthorizationScope))
	conn := old.dial(grpc.WithPerRPCCredentials(&minting{user: "alice"}))
	for range 2 {
		if a := callOn(testCtx(t), conn, createMethod, "k", order("book", 1)); a.err != nil || a.replayed() {
			t.Fatalf("AuthorizationScope, a new token per call: %v", a)
		}
	}
	if n := old.svc.runs.Load(); n != 2 {
		t.Fatalf("AuthorizationScope: %d runs, want 2 (a new token is a new scope)", n)
	}
}
