// Package idemotel reports what the idem middleware decides, and what its
// store costs, as OpenTelemetry metrics and traces.
//
//	tel, err := idemotel.New() // the global providers; see WithMeterProvider, WithTracerProvider
//	m, err := tel.Middleware(memstore.New(), idem.WithTTL(time.Hour))
//
// [Telemetry.Middleware] is the one-liner. It is made of three parts that a
// program can also use on their own: [Telemetry.Observe], the observer of
// the middleware's decisions (idem.WithObserver(tel.Observe)); [Telemetry.Store],
// which wraps a store so that each call is timed and traced; and
// [Telemetry.Watch], which reports the executions a middleware has under
// way.
//
// # Metrics
//
// The instrumentation scope is [ScopeName], at [Version]. The attributes
// of a request are its method and route (http.request.method, http.route:
// the route pattern, never the URL), those of a call of Middleware.Do its
// operation (idem.operation), so that their number is bounded by the
// application's routes and operations.
//
//	idem.requests                  counter, {request}: one per protected request or call of Do, with
//	                               idem.outcome (idem.Outcome.String(): "executed", "replayed", "conflict", ...)
//	idem.handler.duration          histogram, s: how long the handler (or Do's function) ran, with
//	                               idem.outcome; only when it ran (not for a replay, a conflict, a refusal)
//	idem.executions.active         up-down counter (a gauge), {execution}: the executions under way in this
//	                               process, in every middleware given to Watch (idem.Middleware.InFlight)
//	idem.store.operation.duration  histogram, s: each store call, with idem.store (the store's name, see
//	                               WithStoreName), idem.store.operation (acquire, acquire_issued, issue,
//	                               complete, release, extend, lookup, list, remove) and, when the call
//	                               failed, error.type: not_owner, full, invalid, exists, not_found,
//	                               timeout, canceled or other
//	idem.leases.lost               counter, {lease}: executions that outlived their lease (outcome lease-lost),
//	                               with the route's attributes only
//	idem.completion.retries        counter, {retry}: the background retries of storing a result or
//	                               releasing a key after the store failed (idem.Event.Retries), with
//	                               idem.outcome, the outcome they ended with
//
// Exported to Prometheus (go.opentelemetry.io/otel/exporters/prometheus),
// these are idem_requests_total, idem_handler_duration_seconds,
// idem_executions_active, idem_store_operation_duration_seconds,
// idem_leases_lost_total and idem_completion_retries_total, their
// attributes idem_outcome, http_request_method, http_route and so on.
//
// Alert on idem.requests with idem.outcome "store-error" (the store
// failed) and on idem.leases.lost (a handler ran longer than its lease
// could be renewed: see idem.WithLease).
//
// # Traces
//
// Observe adds to the request's span (the one in the request's context,
// from otelhttp or any middleware before idem; only a span that is
// recording) the attributes idem.outcome and idem.replayed, and an event
// "idem.decision" with idem.outcome, the status sent
// (http.response.status_code, for a request) and the completion's retries
// (idem.retries). The store wrapper makes a client span per store call, a
// child of the span in the call's context (the middleware calls its store
// with the request's context, or one that keeps its values, for lease
// renewals and background retries too), named "idem.store <operation>"
// (such as "idem.store acquire"), with idem.store,
// idem.store.operation and idem.storage_key. A failed call sets error.type
// and the span's status to Error, with error.type as its description;
// ErrNotOwner, ErrExists, ErrNotFound and ErrChanged are answers of the
// store, not failures, and leave the status unset.
//
// # What is never reported
//
// No attribute holds a client's idempotency key, a scope (the principal
// by default, see idem.ContextWithPrincipal), credentials, a request or
// response body, or an
// error's text (a store's error may quote what it was given). The storage
// key, idem.storage_key, is a 128-bit hash of the scope, method, route and
// key (see idem.StorageKey), from which none of them can be read back:
// what an operator gives idemadmin or idemctl to look at the entry.
//
// # Cost
//
// With no-op providers (go.opentelemetry.io/otel/metric/noop and
// go.opentelemetry.io/otel/trace/noop), or the global ones while a
// program has set none, the observer and the store wrapper add no
// allocation to a request, after the first of each route, and about
// 0.3 µs (mostly the clock reads that time the store's calls) to a
// request on the memory store. The attribute sets are made once and
// kept, for the first 1000 routes and operations; a route beyond those
// costs a few allocations per request. Store spans are made only when the
// tracer provider is neither a no-op one nor the unset global one. With
// the SDK, the cost is the SDK's: see BenchmarkOverhead.
package idemotel
