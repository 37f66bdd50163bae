// Package idem makes HTTP endpoints idempotent.
//
// A client sends a unique Idempotency-Key header with a request that must
// not run twice (create an order, charge a card). The middleware locks the
// key in a shared store, runs the handler once, stores the complete
// response and answers every retry with it, marked Idempotent-Replayed:
// true. A duplicate that arrives while the first is still running gets 409
// Conflict; a retry with the same key but a different request gets 422.
//
// This package is the framework-neutral core. Use it through an adapter:
// github.com/idemkit/idem/nethttp, .../ginidem or .../echoidem, with a store
// from github.com/idemkit/idem/storage/memstore (one process),
// .../storage/redisstore or .../storage/pgstore (every instance of a
// service).
//
// # Lifecycle of a protected request
//
//  1. Requests whose method is not protected (default POST and PATCH),
//     that matched no route, or that carry no key pass through untouched.
//  2. The key is parsed (a bare token or an RFC 8941 string, 1 to 255
//     printable ASCII bytes), the scope found, the body read in full (up
//     to WithMaxRequestBody) and fingerprinted.
//  3. One store round trip takes the lease, or finds the request in flight
//     (409), or done (replay, or 422 for a different request).
//  4. The handler runs with the body unchanged, its response streams to the
//     client and a copy is kept; the lease is renewed every lease/3.
//  5. One store round trip stores the response for the TTL, or releases
//     the key when the status is not cacheable (5xx), the handler
//     panicked, or it returned without writing anything after its
//     request's context ended. A failed store call is retried in the
//     background for up to one lease; [Middleware.Shutdown] waits for
//     those retries, so call it after http.Server.Shutdown in a deploy.
//
// # Scope: whose record
//
// Records are kept per principal. The application's authentication, once
// it has verified the request's credentials, names the principal in the
// request's context, in one line before idem's middleware:
//
//	r = r.WithContext(idem.ContextWithPrincipal(r.Context(), claims.Subject))
//
// A request without credentials is anonymous (anonymous requests share one
// scope). A request with an Authorization header and no principal is
// refused, 500 [ErrScopeUnknown], before anything runs: the default
// refuses to guess. A raw credential is not a principal: a client whose
// token is refreshed between two attempts would land in another scope and
// run a payment twice, and a principal read from a token that nobody
// verified would let a forged token read another principal's stored
// response. [WithScope] chooses another scope;
// WithScope([AuthorizationScope]) keeps the header whole, for credentials
// that never change between retries (static API keys, Basic).
//
// # Other routes to the same protocol
//
// The key may come from elsewhere in the request, as providers' callbacks
// carry it ([WithKey]: a JSON field, a form field, another header). It may
// be issued by the server with a form and accepted only once it was
// ([WithIssuedKeys], [Middleware.IssueKey]): a double submit then gets the
// first submit's page. And work that arrives without HTTP, such as a
// queue's redelivered messages, runs once per key through [Middleware.Do],
// which takes the same steps as a request, with a function's result in
// place of a response.
//
// Refusals are RFC 9457 problem responses whose Kind is one of the Err
// values below, so tests and error writers can use errors.Is.
//
// # Further reading
//
// The repository's manual (docs/manual.md) covers the options and their
// defaults, events, deploys, the stores and exactly-once with PostgreSQL
// (the storage.Committed state and pgstore's Fence), webhooks, forms, Do
// for queue consumers, the retrying client and security; docs/guarantees.md
// lists each promise with the end-to-end test that proves it.
package idem
