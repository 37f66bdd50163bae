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
// One Middleware may serve HTTP and gRPC. Its options of the protocol
// (idem.WithTTL, WithLease, WithWait, WithFailOpen, WithObserver) apply
// to gRPC calls; its options of HTTP requests (WithHeader, WithMethods,
// WithRequireKey, WithScope, WithFingerprint, WithoutFingerprint,
// WithCacheable, WithMaxRequestBody, WithMaxResponseBody,
// WithErrorWriter, WithOmitHeaders, WithRebuild, WithKey, WithIssuedKeys)
// do not: [UnaryServerInterceptor]'s documentation names the twin of
// each in this package.
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
// A handler that returns neither a reply nor an error, (nil, nil), has
// completed: grpc-go sends its caller an empty message (OK, no bytes),
// and the record keeps that answer, as a google.protobuf.Empty, whose
// bytes are the same (none): a retry gets the same empty message,
// replayed, which decodes into the method's reply type, and the handler
// does not run again.
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
// happened, never with the key, and whose google.rpc.ErrorInfo detail
// (AIP-193: domain [Domain], "github.com/idemkit/idem") names the case
// with a stable reason, the one thing a program should compare: [Reason]
// returns it ("" for a status that is not idem's, such as the
// application's own Aborted or FailedPrecondition).
//
//	the key is in flight in another call         Aborted, ReasonInFlight, with a
//	  (see idem.WithWait to wait for it instead)   google.rpc.RetryInfo detail and retry-after
//	                                               header metadata (whole seconds): when to
//	                                               try again
//	the key was used with another request         FailedPrecondition, ReasonMismatch
//	the key completed, its response was not       FailedPrecondition, ReasonNotReplayable
//	  kept (larger than WithMaxReply, or not
//	  recordable): it is not run again
//	the key is invalid or sent twice              InvalidArgument, ReasonInvalidKey
//	the key is missing (WithRequireKey)           InvalidArgument, ReasonMissingKey
//	the store is unavailable                      Unavailable, ReasonStoreUnavailable, with
//	                                               RetryInfo and retry-after; the handler does
//	                                               not run (with idem.WithFailOpen it runs
//	                                               unprotected)
//	the call's context ended before it ran        Canceled or DeadlineExceeded, as the context,
//	                                               ReasonCanceled
//	the record cannot be read                     Internal, ReasonCorruptRecord
//	"authorization" metadata and no principal     Internal, ReasonScopeUnknown
//	  (the default scope; see WithScope)           (idem.ErrScopeUnknown): name the
//	                                               principal, or set WithScope
//	the request is not a protocol buffer          Internal, ReasonRequestNotComparable
//	  message (see WithoutFingerprint)
//	any other refusal of the core (a kind of      by its HTTP status: 503 Unavailable, other
//	  idem error this version does not know)       5xx Internal, 400 InvalidArgument, 429
//	                                               ResourceExhausted, other 4xx
//	                                               FailedPrecondition; ReasonRefused
//
// # The record
//
// What the store keeps for a call is the result of Do, which the core
// wraps in its own record (with its checksum). Its size is bounded by
// [WithMaxReply]: the message (the response, or the status with its
// details) to 4 MiB by default, gRPC's default limit on the messages a
// client receives, and the rest (the metadata, the type name, the
// lengths) to 64 KiB beside it; idem.WithMaxResponseBody, HTTP's bound,
// does not apply. A larger reply reaches its caller and leaves the key
// done, not replayable. It is this package's own encoding, binary and versioned by its
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
//	Aborted with idem's ErrorInfo, ReasonInFlight    waits the server's delay (RetryInfo, else
//	  (the key in flight), Unavailable (the store      retry-after), else the backoff; retries
//	  down, the connection broken: the call may or     with the same key
//	  may not have reached the server)
//	DeadlineExceeded of the attempt's own deadline   waits the backoff; retries with the same key
//	  (WithPerAttemptTimeout), the call's context
//	  still alive
//	an application's own Aborted (no ErrorInfo of    returned, never retried
//	  idem's), FailedPrecondition, InvalidArgument,
//	  and every other status
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
//
// grpc-go's own retries (a retryPolicy in the service config) compose
// with the interceptor: they happen inside each of its attempts, below
// it, and resend the call's metadata as it was, so the key is kept. But a
// retryPolicy retries the codes it names whoever produced them: one that
// names Aborted retries an application's own Aborted too, and does not
// wait the delay idem asks for (it follows its own backoff). Leave
// Aborted out of retryPolicy's retryableStatusCodes and let this
// interceptor retry idem's Aborted, or use the interceptor alone
// (WithMaxAttempts bounds its attempts, not grpc-go's within them).
// Each attempt's deadline, with WithPerAttemptTimeout, bounds grpc-go's
// retries within it too.
package grpcidem
