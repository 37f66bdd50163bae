package grpcidem

import (
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// recorder is the grpc.ServerTransportStream of a protected handler: it
// passes the handler's header and trailer metadata on to the call's own
// stream, as usual, and keeps a copy of what that stream took, for the
// record.
type recorder struct {
	inner grpc.ServerTransportStream // the call's; nil outside a gRPC server

	mu              sync.Mutex
	header, trailer metadata.MD
}

// errNoStream is what a recorder answers when the call has no stream (the
// interceptor was called outside a gRPC server), as grpc.SetHeader does.
var errNoStream = status.Error(codes.Internal, "grpcidem: no server transport stream in the context")

// Method returns the call's full method name.
func (r *recorder) Method() string {
	if r.inner == nil {
		return ""
	}
	return r.inner.Method()
}

// SetHeader passes md to the call's stream and, when it took it, keeps it.
func (r *recorder) SetHeader(md metadata.MD) error {
	return r.keep(&r.header, md, grpc.ServerTransportStream.SetHeader)
}

// SendHeader sends md with the header set so far and keeps it.
func (r *recorder) SendHeader(md metadata.MD) error {
	return r.keep(&r.header, md, grpc.ServerTransportStream.SendHeader)
}

// SetTrailer passes md to the call's stream and, when it took it, keeps it.
func (r *recorder) SetTrailer(md metadata.MD) error {
	return r.keep(&r.trailer, md, grpc.ServerTransportStream.SetTrailer)
}

// keep calls pass with md and joins md to *to if pass succeeded. The lock
// orders concurrent calls, so that the copy is what the stream took.
func (r *recorder) keep(to *metadata.MD, md metadata.MD, pass func(grpc.ServerTransportStream, metadata.MD) error) error {
	if r.inner == nil {
		return errNoStream
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := pass(r.inner, md); err != nil {
		return err
	}
	if md.Len() > 0 {
		*to = metadata.Join(*to, md)
	}
	return nil
}

// taken returns the header and trailer kept so far. They are not changed
// afterwards: keep replaces them (metadata.Join makes a new MD).
func (r *recorder) taken() (header, trailer metadata.MD) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.header, r.trailer
}
