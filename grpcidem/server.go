package grpcidem

import (
	"context"
	"errors"
	"net/http"

	"github.com/idemkit/idem"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"
)

// The messages of the statuses the interceptor answers with. None holds
// the key.
const (
	msgMissingKey   = "This method requires an idempotency key."
	msgMultipleKeys = "The idempotency key was sent more than once."
	msgConflict     = "A call with this idempotency key is still being processed; retry later."
	msgMismatch     = "This idempotency key was already used with a different request."
	msgStore        = "The idempotency store is unavailable; retry later."
	msgNotKept      = "The call with this idempotency key completed, but its response was not kept; it is not run again."
	msgCorrupt      = "The stored response for this idempotency key cannot be read."
	msgCanceled     = "The call ended before it was processed: "
	msgNotProto     = "grpcidem: the request is not a protocol buffer message; see WithoutFingerprint."
	msgScopeUnknown = "grpcidem cannot tell which principal this call acts for: name it with idem.ContextWithPrincipal in an authentication interceptor chained before grpcidem's, or choose a scope with grpcidem.WithScope (grpcidem.AuthorizationScope keeps the old behaviour: the authorization metadata whole)."
)

// UnaryServerInterceptor returns the interceptor that makes a server's
// unary calls idempotent on m: the handler of a call carrying a key runs
// once, across every process sharing m's store, and every retry gets its
// answer again. See the package documentation for what it does, in
// which order, and how it answers. It panics when m is nil or an option
// is invalid.
//
// One Middleware may serve HTTP and gRPC alike. Of m's options, those of
// the protocol apply to gRPC calls: idem.WithTTL, WithLease, WithWait,
// WithFailOpen and WithObserver (a call's events have its full method as
// Route and an empty Method). Those of HTTP requests are ignored here,
// and this interceptor's options take their places:
//
//	idem option                          grpcidem twin
//	WithHeader                           WithKeyHeader
//	WithRequireKey                       WithRequireKey
//	WithMethods (HTTP methods)           WithMethods (full method names)
//	WithScope                            WithScope
//	WithFingerprint, WithoutFingerprint  WithoutFingerprint (the request message is compared)
//	WithCacheable                        WithStoredCodes
//	WithMaxResponseBody                  WithMaxReply
//	WithMaxRequestBody                   none: grpc.MaxRecvMsgSize bounds requests
//	WithErrorWriter                      none: refusals are statuses with an ErrorInfo
//	WithOmitHeaders                      none: all the metadata the handler set is kept
//	WithRebuild                          none: a reply not kept is refused, ReasonNotReplayable
//	WithKey, WithIssuedKeys              none: the key is the metadata's, as it stands
//
// Put it after the interceptors that authenticate (so that the scope can
// name the principal), log and recover from panics, in
// grpc.ChainUnaryInterceptor: a panic then releases the key before the
// recovery answers.
func UnaryServerInterceptor(m *idem.Middleware, opts ...Option) grpc.UnaryServerInterceptor {
	if m == nil {
		panic("grpcidem: UnaryServerInterceptor: nil *idem.Middleware")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if cfg.methods != nil && !cfg.methods[info.FullMethod] {
			return handler(ctx, req)
		}
		keys := metadata.ValueFromIncomingContext(ctx, cfg.header)
		switch {
		case len(keys) == 0 && cfg.requireKey:
			return nil, refusal(ctx, &idem.Error{Kind: idem.ErrMissingKey, Status: http.StatusBadRequest})
		case len(keys) == 0:
			return handler(ctx, req)
		case len(keys) > 1:
			return nil, refusal(ctx, &idem.Error{Kind: idem.ErrInvalidKey, Status: http.StatusBadRequest, Detail: msgMultipleKeys})
		}
		var a [2]idem.CallOption
		callOpts := append(a[:0], idem.WithCallMaxResult(cfg.maxReply+replyRoom))
		switch {
		case cfg.scope != nil:
			callOpts = append(callOpts, idem.WithCallScope(cfg.scope(ctx)))
		case !hasPrincipal(ctx) && len(metadata.ValueFromIncomingContext(ctx, "authorization")) > 0:
			return nil, refusal(ctx, errScopeUnknown)
		} // else Do's scope is the principal in ctx, or none
		if !cfg.noFP {
			msg, ok := req.(proto.Message)
			if !ok {
				return nil, answerStatus(ctx, codes.Internal, ReasonRequestNotComparable, msgNotProto, 0, nil)
			}
			fp, err := deterministic.Marshal(msg)
			if err != nil {
				return nil, answerStatus(ctx, codes.Internal, ReasonRequestNotComparable, "grpcidem: the request cannot be marshalled: "+err.Error(), 0, nil)
			}
			callOpts = append(callOpts, idem.WithCallFingerprint(fp))
		}
		c := &call{stored: cfg.stored, maxReply: cfg.maxReply, handler: handler, req: req}
		c.rec.inner = grpc.ServerTransportStreamFromContext(ctx)
		out, err := m.Do(grpc.NewContextWithServerTransportStream(ctx, &c.rec), info.FullMethod, keys[0], c.run, callOpts...)
		switch {
		case c.ran: // executed here, or unprotected (WithFailOpen)
			return c.resp, c.err
		case err != nil:
			return nil, refusal(ctx, err)
		}
		return replay(ctx, out)
	}
}

// errScopeUnknown refuses a call with credentials and no principal under
// the default scope (see WithScope).
var errScopeUnknown = &idem.Error{Kind: idem.ErrScopeUnknown, Status: 500, Title: "Idempotency scope unknown", Detail: msgScopeUnknown}

// hasPrincipal reports whether ctx names a principal.
func hasPrincipal(ctx context.Context) bool {
	_, ok := idem.PrincipalFromContext(ctx)
	return ok
}

// call is one protected call whose handler may run.
type call struct {
	stored   func(codes.Code) bool
	maxReply int
	handler  grpc.UnaryHandler
	req      any
	rec      recorder

	// What the handler returned, when it ran.
	ran  bool
	resp any
	err  error
}

// errNotKept is what run returns, after idem.MarkDone, for an answer that
// cannot be recorded: the key is kept done, not replayable.
var errNotKept = errors.New("grpcidem: the response cannot be recorded")

// run is Do's function: it runs the handler under the lease and returns
// its record, or an error for a status that is not stored (Do releases
// the key).
func (c *call) run(ctx context.Context) ([]byte, error) {
	c.ran = true
	c.resp, c.err = c.handler(ctx, c.req)
	r := record{}
	if c.err != nil {
		st := status.Convert(c.err)
		if !c.stored(st.Code()) {
			return nil, c.err
		}
		r.status = st.Proto()
		if deterministic.Size(r.status) > c.maxReply {
			return notKept(ctx)
		}
	} else {
		msg, ok := c.resp.(proto.Message)
		if c.resp == nil {
			// grpc-go sends a nil reply as an empty message (no bytes):
			// kept as an Empty, whose bytes are the same.
			msg, ok = nilReply, true
		}
		if !ok {
			return notKept(ctx)
		}
		r.typeName, r.response = msg.ProtoReflect().Descriptor().FullName(), msg
		if _, err := protoregistry.GlobalTypes.FindMessageByName(r.typeName); err != nil {
			return notKept(ctx) // a replay could not make one
		}
		if deterministic.Size(msg) > c.maxReply {
			return notKept(ctx)
		}
	}
	r.header, r.trailer = c.rec.taken()
	b, err := appendRecord(nil, &r)
	if err != nil {
		return notKept(ctx)
	}
	return b, nil
}

// nilReply is what a nil reply is recorded as: a message of no bytes.
var nilReply = new(emptypb.Empty)

// notKept keeps the key done, not replayable: the handler ran, and its
// answer, sent to its caller as it is, cannot be recorded.
func notKept(ctx context.Context) ([]byte, error) {
	idem.MarkDone(ctx)
	return nil, errNotKept
}

// replay answers a retry with the record out: the header metadata, marked
// replayed, the trailer, and the response or the status.
func replay(ctx context.Context, out []byte) (any, error) {
	r, err := decodeRecord(out)
	if err != nil {
		return nil, answerStatus(ctx, codes.Internal, ReasonCorruptRecord, msgCorrupt, 0, nil)
	}
	var resp proto.Message
	if r.status == nil {
		mt, err := protoregistry.GlobalTypes.FindMessageByName(r.typeName)
		if err != nil {
			return nil, answerStatus(ctx, codes.Internal, ReasonCorruptRecord, "The stored response's message type "+string(r.typeName)+" is not known to this program; it cannot be replayed.", 0, nil)
		}
		resp = mt.New().Interface()
		if err := proto.Unmarshal(r.message, resp); err != nil {
			return nil, answerStatus(ctx, codes.Internal, ReasonCorruptRecord, msgCorrupt, 0, nil)
		}
	}
	if r.header == nil {
		r.header = make(metadata.MD, 1)
	}
	r.header[ReplayedHeader] = replayedValue
	grpc.SetHeader(ctx, r.header)
	grpc.SetTrailer(ctx, r.trailer)
	if r.status != nil {
		return nil, status.ErrorProto(r.status)
	}
	return resp, nil
}

// replayedValue is the value of the replayed mark. Shared: gRPC copies
// the metadata it is given.
var replayedValue = []string{"true"}
