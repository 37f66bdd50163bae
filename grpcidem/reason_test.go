package grpcidem_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/grpcidem"
	"github.com/idemkit/idem/storage"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// errorInfo returns the google.rpc.ErrorInfo detail of err's status, or
// nil.
func errorInfo(err error) *errdetails.ErrorInfo {
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			return ei
		}
	}
	return nil
}

// TestRefusalsCarryErrorInfo: every refusal of the server interceptor
// carries a google.rpc.ErrorInfo whose domain is idem's and whose reason
// tells the case apart (two FailedPrecondition among them), beside the
// RetryInfo of those that have a delay. The reasons are checked as they
// go on the wire: they are a stable protocol.
func TestRefusalsCarryErrorInfo(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	handler := func(ctx context.Context, req *structpb.Struct) (proto.Message, error) {
		switch req.Fields["item"].GetStringValue() {
		case "slow":
			entered <- struct{}{}
			<-release
		case "large":
			return wrapperspb.String(strings.Repeat("x", 4096)), nil
		}
		return okHandler(ctx, req)
	}
	var corrupt atomic.Bool
	var fs *failingStore
	e := start(t, setup{store: "memory", network: "bufconn", handler: handler,
		server: []grpcidem.Option{grpcidem.WithMaxReply(1024)},
		wrapStore: func(st storage.Store) storage.Store {
			fs = &failingStore{Store: &corruptingStore{Store: st, on: &corrupt}}
			return fs
		}})

	type refusal struct {
		name   string
		answer answer
		code   codes.Code
		reason string
		delay  bool
	}
	var got []refusal
	add := func(name string, a answer, code codes.Code, reason string, delay bool) {
		got = append(got, refusal{name, a, code, reason, delay})
	}

	// In flight.
	slow := "slow-" + randomHex()
	done := make(chan answer, 1)
	go func() { done <- e.call(testCtx(t), createMethod, slow, order("slow", 1)) }()
	within(t, entered, "the handler")
	add("in flight", e.call(testCtx(t), createMethod, slow, order("slow", 1)), codes.Aborted, "IDEMPOTENCY_KEY_IN_USE", true)
	close(release)
	within(t, done, "the first call")

	// Reused with another request.
	add("mismatch", e.call(testCtx(t), createMethod, slow, order("other", 1)), codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED", false)

	// Completed, response not kept (larger than WithMaxReply).
	large := "large-" + randomHex()
	e.call(testCtx(t), createMethod, large, order("large", 1))
	add("not kept", e.call(testCtx(t), createMethod, large, order("large", 1)), codes.FailedPrecondition, "IDEMPOTENT_RESPONSE_NOT_KEPT", false)

	// Invalid key, and a key sent twice.
	add("invalid key", e.call(testCtx(t), createMethod, "", order("book", 1), grpcidem.DefaultKeyHeader, strings.Repeat("k", 256)), codes.InvalidArgument, "IDEMPOTENCY_KEY_INVALID", false)
	add("two keys", e.call(testCtx(t), createMethod, "", order("book", 1), grpcidem.DefaultKeyHeader, "a", grpcidem.DefaultKeyHeader, "b"), codes.InvalidArgument, "IDEMPOTENCY_KEY_INVALID", false)

	// The record cannot be read.
	kept := "kept-" + randomHex()
	e.call(testCtx(t), createMethod, kept, order("book", 1))
	corrupt.Store(true)
	add("corrupt", e.call(testCtx(t), createMethod, kept, order("book", 1)), codes.Internal, "IDEMPOTENT_RESPONSE_UNREADABLE", false)
	corrupt.Store(false)

	// The store is down.
	fs.down.Store(true)
	add("store down", e.call(testCtx(t), createMethod, "down-"+randomHex(), order("book", 1)), codes.Unavailable, "IDEMPOTENCY_STORE_UNAVAILABLE", true)
	fs.down.Store(false)

	// No key, WithRequireKey.
	r := start(t, setup{store: "memory", network: "bufconn", server: []grpcidem.Option{grpcidem.WithRequireKey()}})
	add("missing key", r.call(testCtx(t), createMethod, "", order("book", 1)), codes.InvalidArgument, "IDEMPOTENCY_KEY_MISSING", false)

	// The call's context ended before it was processed.
	in := grpcidem.UnaryServerInterceptor(e.m)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := in(metadata.NewIncomingContext(canceled, metadata.Pairs(grpcidem.DefaultKeyHeader, "canceled-"+randomHex())),
		order("book", 1), &grpc.UnaryServerInfo{FullMethod: createMethod},
		func(context.Context, any) (any, error) { t.Error("the handler ran"); return nil, nil })
	add("canceled", answer{err: err}, codes.Canceled, "IDEMPOTENT_CALL_CANCELED", false)

	for _, c := range got {
		ei := errorInfo(c.answer.err)
		switch {
		case c.answer.code() != c.code:
			t.Errorf("%s: %v, want %v", c.name, c.answer, c.code)
		case ei == nil:
			t.Errorf("%s: %v carries no ErrorInfo", c.name, c.answer.err)
		case ei.GetDomain() != "github.com/idemkit/idem" || ei.GetReason() != c.reason:
			t.Errorf("%s: ErrorInfo %v, want reason %s in domain github.com/idemkit/idem", c.name, ei, c.reason)
		case grpcidem.Reason(c.answer.err) != c.reason:
			t.Errorf("%s: Reason %q, want %q", c.name, grpcidem.Reason(c.answer.err), c.reason)
		case c.delay && retryInfo(c.answer.err) <= 0:
			t.Errorf("%s: no RetryInfo beside the ErrorInfo", c.name)
		}
	}
}

// TestUnknownKindRefusal: a kind of idem error the interceptor does not
// know (one added to the core after this version) is answered by its HTTP
// status, with the generic reason and the status in the ErrorInfo's
// metadata; an error that is no idem refusal is Internal, generic too.
func TestUnknownKindRefusal(t *testing.T) {
	unknown := errors.New("idem: some new refusal")
	for _, c := range []struct {
		status int
		want   codes.Code
	}{
		{500, codes.Internal}, {503, codes.Unavailable}, {502, codes.Internal},
		{400, codes.InvalidArgument}, {409, codes.FailedPrecondition}, {422, codes.FailedPrecondition},
		{429, codes.ResourceExhausted}, {0, codes.Internal},
	} {
		err := grpcidem.Refusal(context.Background(), &idem.Error{Kind: unknown, Status: c.status, Detail: "Something new."})
		ei := errorInfo(err)
		if status.Code(err) != c.want || grpcidem.Reason(err) != grpcidem.ReasonRefused || ei.GetMetadata()["http_status"] != strconv.Itoa(c.status) {
			t.Errorf("HTTP %d: %v, ErrorInfo %v; want %v, %s", c.status, err, ei, c.want, grpcidem.ReasonRefused)
		}
	}
	err := grpcidem.Refusal(context.Background(), errors.New("not an idem error"))
	if status.Code(err) != codes.Internal || grpcidem.Reason(err) != grpcidem.ReasonRefused {
		t.Errorf("a foreign error: %v, want Internal, %s", err, grpcidem.ReasonRefused)
	}
	// A known kind with a delay carries the RetryInfo too.
	err = grpcidem.Refusal(context.Background(), &idem.Error{Kind: idem.ErrConflict, Status: 409, RetryAfter: 2 * time.Second})
	if status.Code(err) != codes.Aborted || grpcidem.Reason(err) != grpcidem.ReasonInFlight || retryInfo(err) != 2*time.Second {
		t.Errorf("a conflict: %v, want Aborted, %s, RetryInfo 2s", err, grpcidem.ReasonInFlight)
	}
}

// TestReason: Reason tells idem's refusals from everything else.
func TestReason(t *testing.T) {
	mine := grpcidem.Refusal(context.Background(), &idem.Error{Kind: idem.ErrMismatch, Status: 422})
	st, _ := status.New(codes.FailedPrecondition, "an application's").WithDetails(&errdetails.ErrorInfo{Reason: grpcidem.ReasonMismatch, Domain: "example.com"})
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"not a status", errors.New("plain"), ""},
		{"an application's status", status.Error(codes.Aborted, "busy"), ""},
		{"another domain's ErrorInfo", st.Err(), ""},
		{"idem's", mine, grpcidem.ReasonMismatch},
		{"idem's, wrapped", fmt.Errorf("calling: %w", mine), grpcidem.ReasonMismatch},
	} {
		if got := grpcidem.Reason(c.err); got != c.want {
			t.Errorf("%s: Reason %q, want %q", c.name, got, c.want)
		}
	}
}
