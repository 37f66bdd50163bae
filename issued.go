package idem

import (
	"crypto/rand"
	"errors"
	"fmt"
	"hash/maphash"
	"net/http"
	"sync"
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
// asked for the key (see [WithScope]; by default the principal that
// [ContextWithPrincipal] named) must be the scope of the request that
// uses it. Under the default scope, IssueKey and the middleware refuse a
// request that carries an Authorization header and names no principal
// (ErrScopeUnknown). A request
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
// An issued key is the client's: the scope of its first use must be the
// scope it was issued to. Its first use binds it to that request's method
// and route, whatever the request comparison (WithFingerprint,
// WithoutFingerprint, or none with WithKey): used again on another route
// (of this middleware, or of another on the same store) it gets 422
// ErrMismatch, never the first route's stored response. Within the route,
// the request comparison applies as usual.
//
// IssueKey issues at most WithIssueLimit keys a minute to one scope.
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

// DefaultIssueLimit is how many keys [Middleware.IssueKey] issues to one
// scope a minute, unless WithIssueLimit says otherwise.
const DefaultIssueLimit = 30

// WithIssueLimit sets how many keys [Middleware.IssueKey] issues to one
// scope (see [WithScope]) a minute, n by default [DefaultIssueLimit], with
// a burst of n: a client past it gets ErrTooManyKeys. Every issued key
// occupies the store until it is used or its WithIssuedKeys TTL ends
// (about 170 bytes on Redis, so a million keys cost about 170 MB for that
// long), and asking for one costs nothing, so without a bound one client
// could fill the store. The bound holds for each process, not across
// them, and keeps its memory bounded whatever the number of scopes (4096
// buckets: scopes whose hashes share one share its rate). It bounds each
// scope, not the number of scopes: a site that gives keys to anonymous
// sessions should also limit how fast sessions are made. n must be at
// least 1; New returns an error wrapping ErrInvalidOption otherwise. It
// matters only WithIssuedKeys.
func WithIssueLimit(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return invalid("WithIssueLimit(%d): must be at least 1", n)
		}
		c.issueLimit = n
		return nil
	}
}

// issueLimit is a rate limit of the keys issued per scope: a leaky bucket
// per scope, in a fixed table so that its memory does not grow with the
// number of scopes. The table's index is a hash of the scope under a seed
// of this process's own, so a client cannot choose another's bucket.
type issueLimit struct {
	seed maphash.Seed
	per  float64 // keys a minute, and the burst

	mu      sync.Mutex
	buckets [4096]struct {
		spent float64   // keys issued and not yet leaked away
		at    time.Time // when spent was last brought up to date
	}
}

func newIssueLimit(per int) *issueLimit {
	return &issueLimit{seed: maphash.MakeSeed(), per: float64(per)}
}

// take counts one key issued to scope, or returns how long until one may
// be when the scope is at its limit.
func (l *issueLimit) take(scope string) (ok bool, wait time.Duration) {
	b := &l.buckets[maphash.String(l.seed, scope)%uint64(len(l.buckets))]
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b.spent = max(0, b.spent-now.Sub(b.at).Minutes()*l.per)
	b.at = now
	if b.spent+1 > l.per {
		return false, time.Duration((b.spent + 1 - l.per) / l.per * float64(time.Minute))
	}
	b.spent++
	return true, 0
}

// IssueKey issues a new key to the client of r (r's scope, see
// [WithIssuedKeys]) and returns it: 128 bits from crypto/rand, as 26
// characters of base32 (A-Z and 2-7). Put it in the form, or the page,
// whose submission must run once; the client sends it back in the key
// header, or in the field read by the middleware's [WithKey] source (for
// example KeyFromForm("idempotency_key")).
//
// It costs one store round trip. It returns an error wrapping
// ErrInvalidOption when the middleware was made without WithIssuedKeys;
// an [*Error] wrapping ErrTooManyKeys (status 429, with RetryAfter) when
// r's scope was issued as many keys as WithIssueLimit allows, without
// asking the store; an [*Error] wrapping ErrScopeUnknown (status 500) when
// r carries credentials and no principal under the default scope (see
// [WithScope]); and one wrapping ErrStoreUnavailable and the store's error
// when the store fails.
func (m *Middleware) IssueKey(r *http.Request) (string, error) {
	if m.issuer == nil {
		return "", fmt.Errorf("%w: IssueKey needs a middleware made WithIssuedKeys", ErrInvalidOption)
	}
	scope, e := m.cfg.scopeOf(r)
	if e != nil {
		return "", e
	}
	if ok, wait := m.issued.take(scope); !ok {
		return "", newError(ErrTooManyKeys, "Too many idempotency keys were issued to this client; retry later.", max(wait, time.Second), nil)
	}
	key := rand.Text()
	h := getHasher()
	var a [storageKeyLen]byte
	skey := string(h.appendIssuedKey(a[:0], scope, key))
	putHasher(h)
	// ErrExists under a key of 128 fresh random bits is this very Issue,
	// resent by the store's client after a timeout: the key is issued.
	if err := m.issuer.Issue(r.Context(), skey, m.cfg.issuedTTL); err != nil && !errors.Is(err, storage.ErrExists) {
		return "", fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	return key, nil
}
