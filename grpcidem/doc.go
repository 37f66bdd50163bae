// Package grpcidem gives gRPC's unary calls the promise that idem gives
// HTTP requests: a call that carries an idempotency key runs its handler
// once, across every process sharing the store, and every retry gets the
// very same answer, marked replayed. It is built on
// [idem.Middleware.Do], the core's one execution path (lease renewed
// while the handler runs, release on a released status or a panic,
// background retry of the record's storage, [idem.Middleware.Shutdown],
// the observer's events), and adds a server interceptor and a client
// interceptor.
//
//	m, _ := idem.New(redisstore.New(rdb)) // or memstore.New()
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
//		recovery, logging, // outside: they see what the client gets
//		auth, // verifies the credentials: ctx = idem.ContextWithPrincipal(ctx, subject)
//		grpcidem.UnaryServerInterceptor(m),
//	))
//
//	conn, _ := grpc.NewClient(target, creds,
//		grpc.WithChainUnaryInterceptor(grpcidem.UnaryClientInterceptor()))
//
// Streaming calls pass through untouched: the package has no stream
// interceptor, and a server's stream handlers never see it.
//
// # The server interceptor
//
// [UnaryServerInterceptor] takes the key from the call's incoming
// metadata, "idempotency-key" ([WithKeyHeader]). A call without it passes
// through unprotected ([WithRequireKey]: InvalidArgument instead). The key
// is taken as it stands and must be 1 to 255 bytes of printable ASCII,
// the limits of HTTP's keys; a key sent twice is refused. The record of a
// key is apart for each method (the full method name is the operation of
// Do, and the Route of the observer's events) and for each principal: the
// scope, by default the principal that an authentication interceptor
// chained before this one named with idem.ContextWithPrincipal, once it
// verified the call's credentials ([WithScope]). A call with
// "authorization" metadata and no principal is refused rather than scoped
// by its raw credential, which per-call and refreshed tokens change
// between attempts.
// The request is deterministically marshalled and hashed with the key
// ([WithoutFingerprint] turns that off): a retry must send the same
// request.
//
// The handler runs with a context whose grpc.ServerTransportStream passes
// the header and trailer metadata it sets (grpc.SetHeader, SendHeader,
// SetTrailer) on to the call, as usual, and keeps a copy. The context
// carries the key's [idem.Info] and lease, as a request's does:
// idem.FromContext, idem.MarkDone and pgstore's Fence work in the handler.
// (grpc.SetSendCompressor and grpc.ClientSupportedCompressors need gRPC's
// own stream and fail there.) When the handler returns, its answer is
// recorded: the response message's type and bytes, or its status (code,
// message and details), with the header and trailer metadata it set; the
// first caller gets the answer as the handler gave it. A retry with the
// same key gets the record back: the header metadata plus
// "idempotent-replayed: true", the trailer, and a new message of the
// stored type (found in protoregistry.GlobalTypes) made from the stored
// bytes, or the stored status with its details.
//
// A message without map fields goes out byte for byte as it went out the
// first time. A map's entries are not ordered by the protobuf wire format
// and gRPC's codec marshals them in a random order, the first response's
// as a replay's: a replay of a message with maps is the same message
// (proto.Equal), not the same bytes.
//
// A status the handler returns is stored or released by [DefaultStored]
// ([WithStoredCodes] replaces it): InvalidArgument, NotFound,
// AlreadyExists, FailedPrecondition, PermissionDenied, OutOfRange,
// Unimplemented and Unauthenticated are stored and replayed, as a
// response is; Unavailable, ResourceExhausted, Aborted, Internal, Unknown,
// DeadlineExceeded, Canceled and DataLoss release the key, so that a
// retry runs the handler again. A handler that panics releases the key
// too, and the panic goes on to the recovery interceptor outside (which
// answers Internal, as a rule). A handler that called idem.MarkDone before
// returning a released status, or whose answer cannot be recorded (a
// response that is not a registered protocol buffer message), leaves the
// key done but not replayable.
//
// The interceptor refuses a call with a status whose message says what
// happened, never with the key:
//
//	the key is in flight in another call         Aborted, with a google.rpc.RetryInfo
//	  (see idem.WithWait to wait for it instead)   detail and retry-after header metadata
//	                                               (whole seconds): when to try again
//	the key was used with another request         FailedPrecondition
//	the key completed, its response was not       FailedPrecondition
//	  kept (larger than idem.WithMaxResponseBody,
//	  or not recordable): it is not run again
//	the key is invalid, sent twice, or missing    InvalidArgument
//	  (WithRequireKey)
//	the store is unavailable                      Unavailable, with RetryInfo and retry-after;
//	                                               the handler does not run (with
//	                                               idem.WithFailOpen it runs unprotected)
//	the call's context ended before it ran        Canceled or DeadlineExceeded, as the context
//	the record cannot be read                     Internal
//	"authorization" metadata and no principal     Internal (idem.ErrScopeUnknown): name the
//	  (the default scope; see WithScope)           principal, or set WithScope
//
// # The record
//
// What the store keeps for a call is the result of Do, which the core
// wraps in its own record (with its checksum). Its size, the response and
// the metadata together, is bounded by idem.WithMaxResponseBody (1 MiB by
// default). It is this package's own encoding, binary and versioned by its
// first byte; every length and count is an unsigned varint in its
// shortest form (encoding/binary's AppendUvarint):
//
//	version   1 byte: 1
//	kind      1 byte: 0 a response message, 1 a status (an error)
//	header    metadata: the header metadata the handler set
//	trailer   metadata: the trailer metadata the handler set
//	kind 0:   type name: length, then the message's full name (google.protobuf.Struct)
//	          message:   length, then the message, deterministically marshalled
//	kind 1:   status:    length, then the google.rpc.Status (code, message and
//	          details), deterministically marshalled; its code is not OK
//
// Metadata is a count of pairs, then each pair: the key's length and
// bytes, the value's length and bytes (raw: a "-bin" value is not base64
// here). The pairs are sorted by key, a key's values in the order the
// handler set them; no key is empty. Nothing follows the last field. A
// record has one encoding: the decoder refuses any other bytes (a short
// or long varint, unsorted keys, a status not deterministically marshalled,
// trailing bytes), and a record it refuses is answered Internal, never
// run again.
//
// # The client interceptor
//
// [UnaryClientInterceptor] gives each call one key, [NewKey] (or the one
// the caller put in the outgoing metadata), and keeps it across every
// attempt. It retries as the kit's HTTP client does:
//
//	attempt's outcome                                what the interceptor does
//	-----------------------------------------------  --------------------------------------------
//	idempotent-replayed: true in the header (any     returned: the first run's answer
//	  status)
//	OK                                               returned
//	Aborted (the key in flight), Unavailable (the    waits the server's delay (RetryInfo, else
//	  store down, the connection broken: the call      retry-after), else the backoff; retries
//	  may or may not have reached the server)          with the same key
//	FailedPrecondition, InvalidArgument, and every   returned, never retried
//	  other status
//	the context ended                                returned, never retried
//
// A retry waits the server's delay plus up to a tenth of it, or an
// exponential backoff with full jitter: a random time between 0 and
// min(10 s, 100 ms * 2^(n-1)) after attempt n ([WithBackoff]). A call is
// sent at most 5 times ([WithMaxAttempts]); no wait is begun that would
// end more than a minute after the first attempt started
// ([WithMaxElapsed]) or at or after the context's deadline, so no attempt
// starts after it; the last attempt's status is returned at once instead,
// and a wait that the context cuts short returns it too. [WithAttemptHook]
// sees every attempt, for logs and metrics; an [Attempt] never holds the
// key.
package grpcidem
