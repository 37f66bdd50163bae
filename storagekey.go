package idem

// StorageKey returns the key under which a middleware keeps the entry of
// a client's idempotency key: the request's [Info.StorageKey], and what a
// storage.Inspector takes (an operator's look-up of "this customer's
// order-42", say). scope is what the middleware's scope function returns
// for the client (WithScope; by default the principal that
// [ContextWithPrincipal] named, or "" for a request without credentials),
// method the request's method, route the route as the
// adapter names it (nethttp: the ServeMux pattern, such as "POST
// /orders"; Gin: c.FullPath(); Echo: c.Path()), and key the key the
// client sent. A middleware WithIssuedKeys names entries by scope and key
// only: see [IssuedStorageKey]; [Middleware.Do], by operation and key:
// see [OperationStorageKey].
func StorageKey(scope, method, route, key string) string {
	h := getHasher()
	defer putHasher(h)
	return string(h.appendStorageKey(nil, scope, method, route, key))
}

// IssuedStorageKey returns the key under which a middleware WithIssuedKeys
// keeps the entry of a key it issued to the client of scope (see
// [StorageKey]).
func IssuedStorageKey(scope, key string) string {
	h := getHasher()
	defer putHasher(h)
	return string(h.appendIssuedKey(nil, scope, key))
}

// OperationStorageKey returns the key under which [Middleware.Do] keeps
// the entry of key for the operation op (see [StorageKey]), for a call
// WithCallScope(scope), or without WithCallScope but with the principal
// scope in its ctx ([ContextWithPrincipal]); scope "" for an unscoped
// call.
func OperationStorageKey(scope, op, key string) string {
	h := getHasher()
	defer putHasher(h)
	if scope != "" {
		return string(h.appendScopedDoKey(nil, scope, op, key))
	}
	return string(h.appendDoKey(nil, op, key))
}
