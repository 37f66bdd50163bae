package grpcidem

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idem"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Domain is the domain of the google.rpc.ErrorInfo detail that every
// status the server interceptor answers with on its own carries (AIP-193):
// with it, a Reason is idem's, not an application's.
const Domain = "github.com/idemkit/idem"

// The reasons of the google.rpc.ErrorInfo detail (in [Domain]) of the
// statuses the server interceptor answers with, one per case: stable
// values that a program compares, where the status's message is for
// people and may change. [Reason] returns the one of an error.
const (
	// ReasonInFlight: a call with the same key is still running (the
	// handler runs there); Aborted, with a google.rpc.RetryInfo and
	// retry-after metadata. The one reason the client interceptor
	// retries an Aborted for. idem.ErrConflict.
	ReasonInFlight = "IDEMPOTENCY_KEY_IN_USE"
	// ReasonMismatch: the key was already used with another request;
	// FailedPrecondition. idem.ErrMismatch.
	ReasonMismatch = "IDEMPOTENCY_KEY_REUSED"
	// ReasonNotReplayable: the call with this key completed, but its
	// answer was not kept (larger than WithMaxReply, not recordable), so
	// it cannot be replayed; the handler is not run again.
	// FailedPrecondition. idem.ErrNotReplayable.
	ReasonNotReplayable = "IDEMPOTENT_RESPONSE_NOT_KEPT"
	// ReasonInvalidKey: the key is empty, longer than 255 bytes, not
	// printable ASCII, or sent more than once; InvalidArgument.
	// idem.ErrInvalidKey.
	ReasonInvalidKey = "IDEMPOTENCY_KEY_INVALID"
	// ReasonMissingKey: the call has no key and WithRequireKey is set;
	// InvalidArgument. idem.ErrMissingKey.
	ReasonMissingKey = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyNotIssued: the key was not issued to this caller, or its
	// issue expired; InvalidArgument. idem.ErrKeyNotIssued.
	ReasonKeyNotIssued = "IDEMPOTENCY_KEY_NOT_ISSUED"
	// ReasonStoreUnavailable: the idempotency store could not be reached
	// and the handler did not run; Unavailable, with a google.rpc.RetryInfo
	// and retry-after metadata. idem.ErrStoreUnavailable.
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	// ReasonCanceled: the call's context ended (the client went away, its
	// deadline passed) before the handler ran; Canceled or
	// DeadlineExceeded, as the context. idem.ErrCanceled.
	ReasonCanceled = "IDEMPOTENT_CALL_CANCELED"
	// ReasonCorruptRecord: the stored answer of this key cannot be read
	// (corrupt, or of a message type this program does not know); the
	// handler is not run again. Internal. idem.ErrCorruptRecord.
	ReasonCorruptRecord = "IDEMPOTENT_RESPONSE_UNREADABLE"
	// ReasonScopeUnknown: the call carries "authorization" metadata and
	// no principal (idem.ContextWithPrincipal), under the default scope:
	// the interceptor refuses to guess who it acts for (see WithScope);
	// Internal, a setup error of the server. idem.ErrScopeUnknown.
	ReasonScopeUnknown = "IDEMPOTENCY_SCOPE_UNKNOWN"
	// ReasonRequestNotComparable: the request cannot be compared with the
	// first one (it is not a protocol buffer message, or does not
	// marshal); Internal, a programming error (see WithoutFingerprint).
	ReasonRequestNotComparable = "IDEMPOTENT_REQUEST_NOT_COMPARABLE"
	// ReasonRefused: any other refusal, from a kind of idem error this
	// version does not know (its code follows its HTTP status: 503
	// Unavailable, other 5xx Internal, 400 InvalidArgument, 429
	// ResourceExhausted, other 4xx FailedPrecondition; the ErrorInfo's
	// metadata "http_status" holds that status), or an error that is no
	// idem refusal (Internal).
	ReasonRefused = "IDEMPOTENCY_REFUSED"
)

// Reason returns the reason of the google.rpc.ErrorInfo in [Domain] that
// err's status carries (for example [ReasonInFlight]), on the server's
// side or the client's: "" when err is nil, not a status, or not a
// refusal of the server interceptor (an application's own status, a
// replayed status of the handler). Errors that wrap a status are seen
// through.
func Reason(err error) string {
	if ei := idemInfo(err); ei != nil {
		return ei.GetReason()
	}
	return ""
}

// idemInfo returns the ErrorInfo in Domain of err's status, or nil.
func idemInfo(err error) *errdetails.ErrorInfo {
	st, ok := status.FromError(err)
	if !ok || err == nil || len(st.Proto().GetDetails()) == 0 {
		return nil
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == Domain {
			return ei
		}
	}
	return nil
}

// refusalKind is how one kind of idem error is answered.
type refusalKind struct {
	code   codes.Code
	reason string
	msg    string // "": the error's Detail
}

// refusals maps each kind of idem error the interceptor knows to its
// answer; a kind it does not know is answered by its HTTP status
// (fallback). One place: every refusal goes through refuse.
var refusals = map[error]refusalKind{
	idem.ErrConflict:         {codes.Aborted, ReasonInFlight, msgConflict},
	idem.ErrMismatch:         {codes.FailedPrecondition, ReasonMismatch, msgMismatch},
	idem.ErrNotReplayable:    {codes.FailedPrecondition, ReasonNotReplayable, msgNotKept},
	idem.ErrInvalidKey:       {codes.InvalidArgument, ReasonInvalidKey, ""},
	idem.ErrMissingKey:       {codes.InvalidArgument, ReasonMissingKey, msgMissingKey},
	idem.ErrKeyNotIssued:     {codes.InvalidArgument, ReasonKeyNotIssued, ""},
	idem.ErrStoreUnavailable: {codes.Unavailable, ReasonStoreUnavailable, msgStore},
	idem.ErrCanceled:         {codes.Canceled, ReasonCanceled, ""}, // the code and message are the context's
	idem.ErrCorruptRecord:    {codes.Internal, ReasonCorruptRecord, msgCorrupt},
	idem.ErrScopeUnknown:     {codes.Internal, ReasonScopeUnknown, msgScopeUnknown},
}

// fallback answers a kind of idem error that refusals does not know, by
// its HTTP status.
func fallback(e *idem.Error) refusalKind {
	k := refusalKind{code: codes.FailedPrecondition, reason: ReasonRefused}
	switch {
	case e.Status == http.StatusServiceUnavailable:
		k.code = codes.Unavailable
	case e.Status >= 500 || e.Status < 400:
		k.code = codes.Internal
	case e.Status == http.StatusBadRequest:
		k.code = codes.InvalidArgument
	case e.Status == http.StatusTooManyRequests:
		k.code = codes.ResourceExhausted
	}
	return k
}

// refusal turns an error of Do, whose function did not run, into the
// call's status.
func refusal(ctx context.Context, err error) error {
	var e *idem.Error
	if !errors.As(err, &e) {
		return answerStatus(ctx, codes.Internal, ReasonRefused, "The call could not be processed.", 0, nil)
	}
	k, known := refusals[e.Kind]
	var md map[string]string
	if !known {
		k = fallback(e)
		md = map[string]string{"http_status": strconv.Itoa(e.Status)}
	}
	msg := k.msg
	if msg == "" {
		msg = e.Detail
	}
	if msg == "" {
		msg = "The call could not be processed."
	}
	if e.Kind == idem.ErrCanceled {
		cause := ctx.Err()
		if cause == nil {
			cause = context.Canceled
		}
		k.code, msg = status.FromContextError(cause).Code(), msgCanceled+cause.Error()+"."
	}
	return answerStatus(ctx, k.code, k.reason, msg, e.RetryAfter, md)
}

// answerStatus returns the status of code with msg and a
// google.rpc.ErrorInfo of reason (in Domain, with md); when delay is
// positive, also a google.rpc.RetryInfo of it, and a retry-after header
// entry of it in whole seconds (rounded up, at least 1).
func answerStatus(ctx context.Context, code codes.Code, reason, msg string, delay time.Duration, md map[string]string) error {
	details := make([]protoadapt.MessageV1, 1, 2)
	details[0] = &errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: md}
	if delay > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
		secs := max(int64((delay+time.Second-1)/time.Second), 1)
		grpc.SetHeader(ctx, metadata.Pairs(RetryAfterHeader, strconv.FormatInt(secs, 10)))
	}
	st := status.New(code, msg)
	if with, err := st.WithDetails(details...); err == nil {
		st = with
	}
	return st.Err()
}
