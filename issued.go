package idem

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idem/storage"
)

// This file is the server-issued one-time key: the server hands out a key
// (with a form, say), and a route protected WithIssuedKeys accepts only
// keys it issued to the same client. The first use of a key takes it in
// the same store call, and round trip, that acquires the lease, so a
// double submit runs the handler once and the second submit gets the
// first's response.

// DefaultIssuedKeyTTL is how long an issued key stays usable before its
// first use, unless WithIssuedKeys says otherwise.
const DefaultIssuedKeyTTL = time.Hour

// WithIssuedKeys makes the middleware accept only keys issued by
// [Middleware.IssueKey] to the same client: the scope of the request that
// asked for the key (see [WithScope]; by default its Authorization
// header) must be the scope of the request that uses it. A request
// without a key gets 400 ErrMissingKey (as WithRequireKey); an unknown,
// forged, expired or other client's key gets 400 ErrKeyNotIssued, without
// telling these apart, and the handler does not run.
//
// An issued key is usable for ttl (DefaultIssuedKeyTTL when ttl is 0)
// until its first use. Its first use takes it, in the store call that
// takes the lease: from then on it is an idempotency key as any other,
// whose response is kept for WithTTL and replayed to every retry. When
// the execution is released instead (a 5xx, a panic, a canceled request),
// the key is issued again for ttl, so the client may retry it. When the
// process dies while the handler runs, the key is spent once its lease
// runs out: a retry gets ErrKeyNotIssued, never a second execution (a form
// is then loaded again for a new key).
//
// An issued key is the client's for every route of this middleware, and
// of any middleware on the same store with the same scope, and its record
// does not depend on the route: the request comparison (WithFingerprint)
// still refuses it for a different request.
//
// The store must implement storage.Issuer (every store of this module
// does); New returns an error wrapping ErrInvalidOption when it does not,
// or when ttl is negative.
func WithIssuedKeys(ttl time.Duration) Option {
	return func(c *config) error {
		switch {
		case ttl < 0:
			return invalid("WithIssuedKeys(%v)", ttl)
		case ttl == 0:
			ttl = DefaultIssuedKeyTTL
		}
		c.issuedTTL, c.requireKey = ttl, true
		return nil
	}
}

// IssueKey issues a new key to the client of r (r's scope, see
// [WithIssuedKeys]) and returns it: 128 bits from crypto/rand, as 26
// characters of base32 (A-Z and 2-7). Put it in the form, or the page,
// whose submission must run once; the client sends it back in the key
// header, or in the field read by the middleware's [WithKey] source (for
// example KeyFromForm("idempotency_key")).
//
// It costs one store round trip. It returns an error wrapping
// ErrInvalidOption when the middleware was made without WithIssuedKeys,
// and one wrapping ErrStoreUnavailable and the store's error when the
// store fails.
func (m *Middleware) IssueKey(r *http.Request) (string, error) {
	if m.issuer == nil {
		return "", fmt.Errorf("%w: IssueKey needs a middleware made WithIssuedKeys", ErrInvalidOption)
	}
	key := rand.Text()
	h := getHasher()
	var a [storageKeyLen]byte
	skey := string(h.appendIssuedKey(a[:0], m.cfg.scope(r), key))
	putHasher(h)
	// ErrExists under a key of 128 fresh random bits is this very Issue,
	// resent by the store's client after a timeout: the key is issued.
	if err := m.issuer.Issue(r.Context(), skey, m.cfg.issuedTTL); err != nil && !errors.Is(err, storage.ErrExists) {
		return "", fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	return key, nil
}
