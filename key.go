package idem

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash"
	"net/http"
	"sync"
)

// MaxKeyLen is the longest idempotency key accepted, in bytes after
// unquoting.
const MaxKeyLen = 255

var (
	errKeyEmpty    = errors.New("the key is empty")
	errKeyLong     = errors.New("the key is longer than 255 bytes")
	errKeyChar     = errors.New("the key contains a character outside printable ASCII")
	errKeyQuote    = errors.New("the key is a malformed RFC 8941 string")
	errKeyMultiple = errors.New("the key header was sent more than once")
)

// ParseKey returns the idempotency key carried by a header value. Both a
// bare token (abc-123) and an RFC 8941 sf-string ("abc-123", with \" and \\
// escapes), the form the IETF Idempotency-Key draft specifies, are
// accepted and give the same key. After unquoting the key must be 1 to 255
// bytes of printable ASCII (0x20 to 0x7E). The error wraps ErrInvalidKey.
func ParseKey(v string) (string, error) {
	key, err := parseKey(v)
	if err != nil {
		return "", &keyError{err}
	}
	return key, nil
}

// CheckKey returns nil when key, taken as it stands (not unquoted), is 1
// to 255 bytes of printable ASCII: the keys [Middleware.Do] and a [WithKey]
// source accept. A key header is read by [ParseKey] instead, which also
// accepts the RFC 8941 form. The error wraps ErrInvalidKey.
func CheckKey(key string) error {
	if err := checkBareKey(key); err != nil {
		return &keyError{err}
	}
	return nil
}

type keyError struct{ reason error }

func (e *keyError) Error() string   { return "idem: " + ErrInvalidKey.Error() + ": " + e.reason.Error() }
func (e *keyError) Unwrap() []error { return []error{ErrInvalidKey, e.reason} }

func parseKey(v string) (string, error) {
	if len(v) == 0 {
		return "", errKeyEmpty
	}
	if v[0] != '"' {
		if err := checkBareKey(v); err != nil {
			return "", err
		}
		return v, nil
	}
	// RFC 8941 section 4.2.5: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE.
	if len(v) < 2 || v[len(v)-1] != '"' {
		return "", errKeyQuote
	}
	inner := v[1 : len(v)-1]
	escapes := 0
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		switch {
		case c == '\\':
			if i+1 >= len(inner) || (inner[i+1] != '"' && inner[i+1] != '\\') {
				return "", errKeyQuote
			}
			escapes++
			i++
		case c == '"':
			return "", errKeyQuote
		case c < 0x20 || c > 0x7e:
			return "", errKeyChar
		}
	}
	n := len(inner) - escapes
	switch {
	case n == 0:
		return "", errKeyEmpty
	case n > MaxKeyLen:
		return "", errKeyLong
	case escapes == 0:
		return inner, nil
	}
	b := make([]byte, 0, n)
	for i := 0; i < len(inner); i++ {
		if inner[i] == '\\' {
			i++
		}
		b = append(b, inner[i])
	}
	return string(b), nil
}

// checkBareKey checks a key taken as it stands: 1 to MaxKeyLen bytes of
// printable ASCII.
func checkBareKey(v string) error {
	switch {
	case len(v) == 0:
		return errKeyEmpty
	case len(v) > MaxKeyLen:
		return errKeyLong
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return errKeyChar
		}
	}
	return nil
}

// headerKey reads the key header of r. It reports ok=false when the header
// is absent.
func headerKey(h http.Header, name string) (key string, ok bool, err error) {
	vs := h[name]
	switch len(vs) {
	case 0:
		return "", false, nil
	case 1:
		key, err = parseKey(vs[0])
		return key, true, err
	}
	return "", true, errKeyMultiple
}

// appendFields appends each field length-prefixed, so that no two
// different field lists give the same bytes.
func appendFields(b []byte, fields ...string) []byte {
	for _, f := range fields {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	return b
}

// Lengths of the identifiers of one protected request.
const (
	storageKeyLen  = 22 // base64url of 128 bits
	ownerLen       = 32 // hex of 128 random bits
	fingerprintLen = 16 // 128 bits of SHA-256
)

// hasher is a SHA-256 state with scratch space. Hashers are reused through
// hasherPool, so that hashing allocates nothing.
type hasher struct {
	h   hash.Hash
	buf []byte // the fields to hash
	sum []byte
}

var hasherPool = sync.Pool{New: func() any {
	return &hasher{h: sha256.New(), buf: make([]byte, 0, 256), sum: make([]byte, 0, sha256.Size)}
}}

func getHasher() *hasher { return hasherPool.Get().(*hasher) }

func putHasher(h *hasher) {
	if cap(h.buf) > 4<<10 {
		h.buf = make([]byte, 0, 256)
	}
	hasherPool.Put(h)
}

// sum128 hashes h.buf, then extra, and returns the first 128 bits of the
// digest, valid until the next use of h.
func (h *hasher) sum128(extra []byte) []byte {
	h.h.Reset()
	h.h.Write(h.buf)
	if len(extra) > 0 {
		h.h.Write(extra)
	}
	h.sum = h.h.Sum(h.sum[:0])
	return h.sum[:16]
}

// appendStorageKey appends the name of the record of one key: a hash of
// the scope, method, route and client key, so a client can never reach
// another scope's record, inject characters into a store key or choose a
// cluster slot. It is storageKeyLen characters of unpadded base64url (128
// bits of SHA-256).
func (h *hasher) appendStorageKey(b []byte, scope, method, route, key string) []byte {
	h.buf = appendFields(h.buf[:0], "idem/v1", scope, method, route, key)
	return base64.RawURLEncoding.AppendEncode(b, h.sum128(nil))
}

// appendIssuedKey appends the name of the record of a key issued by
// [Middleware.IssueKey] to a client of the given scope: a hash of the
// scope and the key, as appendStorageKey's but apart from every name it
// gives. It does not depend on the route: an issued key is the client's
// for any route the middleware protects.
func (h *hasher) appendIssuedKey(b []byte, scope, key string) []byte {
	h.buf = appendFields(h.buf[:0], "idem/issued", scope, key)
	return base64.RawURLEncoding.AppendEncode(b, h.sum128(nil))
}

// appendDoKey appends the name of the record of key for the operation op
// of [Middleware.Do], apart from every name the other two give.
func (h *hasher) appendDoKey(b []byte, op, key string) []byte {
	h.buf = appendFields(h.buf[:0], "idem/do", op, key)
	return base64.RawURLEncoding.AppendEncode(b, h.sum128(nil))
}

// appendScopedDoKey appends the name of the record of key for the
// operation op of [Middleware.Do] called WithCallScope(scope), apart from
// every name the others give (appendDoKey's included).
func (h *hasher) appendScopedDoKey(b []byte, scope, op, key string) []byte {
	h.buf = appendFields(h.buf[:0], "idem/do-scoped", scope, op, key)
	return base64.RawURLEncoding.AppendEncode(b, h.sum128(nil))
}

// appendFingerprint appends what identifies the request: by default a
// hash of the method, path, query, Content-Type and body; fingerprintLen
// bytes, or none WithoutFingerprint. Under WithIssuedKeys, whose storage
// key does not name the route, the method and route are hashed in too,
// whatever the comparison: an issued key is bound to the route of its
// first use.
func appendFingerprint(b []byte, h *hasher, cfg *config, r *http.Request, route string, body []byte) []byte {
	h.buf = h.buf[:0]
	if cfg.issuedTTL > 0 {
		h.buf = appendFields(h.buf, "route", r.Method, route)
	}
	switch {
	case cfg.noFP && len(h.buf) == 0:
		return b
	case cfg.noFP:
		return append(b, h.sum128(nil)...)
	case cfg.fingerprint != nil:
		h.buf = appendFields(h.buf, "custom", cfg.fingerprint(r, body))
		return append(b, h.sum128(nil)...)
	}
	h.buf = appendFields(h.buf, "default", r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("Content-Type"))
	return append(b, h.sum128(body)...)
}

// requestIDs returns the storage key of the request's key on route in
// scope, a new owner token and the request's fingerprint, all three in one
// allocation.
func requestIDs(cfg *config, r *http.Request, scope, route, key string, body []byte) (skey, owner, fp string) {
	h := getHasher()
	var a [storageKeyLen + ownerLen + fingerprintLen]byte
	var b []byte
	if cfg.issuedTTL > 0 {
		b = h.appendIssuedKey(a[:0], scope, key)
	} else {
		b = h.appendStorageKey(a[:0], scope, r.Method, route, key)
	}
	b = appendOwner(b)
	b = appendFingerprint(b, h, cfg, r, route, body)
	putHasher(h)
	all := string(b)
	return all[:storageKeyLen], all[storageKeyLen : storageKeyLen+ownerLen], all[storageKeyLen+ownerLen:]
}
