// Package idemclient is the client half of the idempotency-key protocol:
// an [http.RoundTripper] that gives every logical request one key, keeps it
// across every retry, retries only what is safe and useful, waits when the
// server says so and stops when it says so. It works with any server that
// follows the Idempotency-Key convention, and is tested against the kit's
// own middleware (github.com/idemkit/idem).
//
//	client := &http.Client{Transport: idemclient.New(), Timeout: time.Minute}
//	resp, err := client.Post(url, "application/json", strings.NewReader(`{"item":"book"}`))
//	if err != nil {
//		return err // the request may have run once, never twice
//	}
//	defer resp.Body.Close()
//	res, _ := idemclient.ResultOf(resp) // res.Attempts, res.Replayed, res.Key
//
// # Keys
//
// Requests whose method is protected (default POST and PATCH, see
// [WithMethods]) get a key in the Idempotency-Key header ([WithHeader])
// unless they carry one. The key is generated per call of RoundTrip, that
// is per request an [http.Client] sends (a version 4 UUID, 122 random bits,
// see [NewKey]), and every attempt of that call carries it; the request of
// a 307 or 308 redirect, a new call, gets a key of its own. It is sent as a
// bare value, which the kit's middleware, like most servers, reads as the
// same key as the RFC 8941 sf-string form of the IETF draft; a key of
// [WithKey] that could be misread bare is quoted. To keep one key across
// calls of Do, redirects or restarts of the process (a job that resumes
// an operation), give it yourself: in the header, or in the context with
// [WithKey]. Requests of other methods go to the base RoundTripper
// untouched: no key, no retry by this transport.
//
// # Retry table
//
// After each attempt of a protected request the transport looks at its
// outcome, in this order:
//
//	Outcome of the attempt                          What the transport does
//	----------------------------------------------  ---------------------------------------------------
//	response with Idempotent-Replayed: true          success: returned, Result.Replayed (any status)
//	2xx, 3xx                                         returned
//	409 with Retry-After (same key in flight)        waits Retry-After, retries with the same key
//	409 without Retry-After (ErrNotReplayable: the   returned, never retried
//	  first completed, its response was not kept;
//	  or an application's own conflict)
//	429, 503 (ErrStoreUnavailable, overload)         waits Retry-After, else the backoff; retries
//	408, 425                                         like 429 (the kit does not store them either)
//	other 5xx but 501 and 505 (the kit released      waits Retry-After, else the backoff; retries
//	  the key: the handler may run again)
//	400, 422 and every other 4xx, 501, 505           returned, never retried
//	connection error or timeout, before or after     waits the backoff, retries with the same key
//	  the request reached the server
//	request context ended, TLS certificate or        returned as the base gave it, never retried
//	  handshake refused, unknown host, https to
//	  a plain-HTTP server
//
// A retry waits Retry-After (seconds or an HTTP date) plus up to a tenth of
// it, so that the clients told the same moment do not all come back at
// once; without Retry-After it waits the backoff: exponential with full
// jitter, a random time between 0 and min(max, base * 2^(n-1)) after
// attempt n ([WithBackoff], default 250 ms and 10 s).
//
// # Limits
//
// A request is sent at most [WithMaxAttempts] times (default 5). No wait is
// begun that would end more than [WithMaxElapsed] after the first attempt
// started (default 1 minute) or at or after the request context's
// deadline (an [http.Client] Timeout is one): the transport returns at
// once instead, and never starts an attempt after the deadline. A context
// that ends during a wait ends it, with the context's error.
//
// When the limits stop a retry, the last response is returned as it is
// (a 503, a 409), with [Result].Err wrapping ErrAttemptsExhausted or
// ErrTimeExhausted; the last error is returned in an [*Error] with the
// same reasons. errors.Is finds both through the [*url.Error] of an
// [http.Client].
//
// # Bodies
//
// The body of every attempt after the first comes from the request's
// GetBody, which [http.NewRequest] sets for a [bytes.Buffer],
// [bytes.Reader] or [strings.Reader]. A body without GetBody is read into
// memory first, up to [WithMaxBufferedBody] (default 1 MiB, the kit's
// request limit); a larger one is streamed once, and if that attempt calls
// for a retry, the transport stops with ErrBodyNotRewindable instead.
//
// # Outcome and hooks
//
// [ResultOf] tells, for a response, the key, the number of attempts,
// whether it is a replay and why a retry was not made if one was called
// for. It reads them from resp.Request's context: the transport adds no
// header. [WithAttemptHook] sees every attempt (its status or error, its
// duration, and the wait that follows) for logs and metrics; an [Attempt]
// never holds the key, nor does any error of this package.
//
// # Go's own resend
//
// [http.Transport] treats a request that carries Idempotency-Key (or
// X-Idempotency-Key) as replayable: when a reused keep-alive connection
// breaks before the response, it sends the request once more by itself,
// inside one attempt of this transport, with the same key. With a server
// that honours the key this cannot run the request twice: the resend gets
// the replay, or a 409 that this transport waits out. The transport keeps
// the body rewindable (GetBody) for that resend too.
package idemclient
