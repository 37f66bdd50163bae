package idem

import "context"

// principalKey is the context key of the principal (ContextWithPrincipal).
type principalKey struct{}

// ContextWithPrincipal returns a copy of ctx that names principal (a user
// id, a token's subject, an API client's id: who the request acts for) as
// the one its idempotency keys belong to. It is the one line that an
// application's own authentication adds, once it has verified the
// request's credentials: in an HTTP middleware before idem's,
//
//	r = r.WithContext(idem.ContextWithPrincipal(r.Context(), claims.Subject))
//
// and in a gRPC interceptor before grpcidem's, with the call's ctx.
//
// The default scope (when no WithScope is given, see [WithScope]) is this
// principal: the retries of one operation are one operation when the
// client's credentials change between them (an OAuth access token
// refreshed, per-call credentials minting a token for each call), and two
// principals never share a record. The principal is hashed into the
// record's name, never stored in clear, and never appears in events.
//
// An empty principal names none: PrincipalFromContext then reports false
// (it clears a principal named before in ctx).
func ContextWithPrincipal(ctx context.Context, principal string) context.Context {
	return context.WithValue(ctx, principalKey{}, principal)
}

// PrincipalFromContext returns the principal that [ContextWithPrincipal]
// named in ctx, and whether one is named (a non-empty one).
func PrincipalFromContext(ctx context.Context) (string, bool) {
	p, _ := ctx.Value(principalKey{}).(string)
	return p, p != ""
}
