package idemclient

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
)

// MaxKeyLen is the longest key WithKey accepts, in bytes: the limit of the
// kit's middleware.
const MaxKeyLen = 255

// NewKey returns a new random key: a version 4 UUID (122 random bits from
// crypto/rand) in its 36-character text form, such as
// "3f1c5a4e-8b2d-4f6a-9c7e-1d2b3a4c5d6e". It is what the transport
// generates for a protected request without a key; call it yourself to
// store a key with the operation before sending it, so that a retry after
// a restart of your process carries the same key (see [WithKey]).
func NewKey() string {
	var u [16]byte
	rand.Read(u[:])         // never fails (crypto/rand crashes the program instead)
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // variant 10
	const hex = "0123456789abcdef"
	var b [36]byte
	j := 0
	for i, x := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b[j] = '-'
			j++
		}
		b[j], b[j+1] = hex[x>>4], hex[x&0x0f]
		j += 2
	}
	return string(b[:])
}

type keyCtx struct{}

// WithKey returns a copy of ctx under which a protected request without a
// key header is sent with key, instead of a generated one. Use it to keep
// one key for one logical operation across process restarts, or across
// calls of Client.Do (a key is generated per call of RoundTrip otherwise),
// including the requests of a 307 or 308 redirect. A key header on the
// request itself takes precedence.
//
// The key must be 1 to 255 bytes of printable ASCII (the kit's rule);
// otherwise RoundTrip returns an error wrapping ErrInvalidKey without
// sending the request. It is sent as it stands, or as an RFC 8941
// sf-string ("...", with \" and \\ escaped) when it starts with a double
// quote or starts or ends with a space, so that the server reads the same
// key.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// keyValue returns the header value for a request under ctx: the key given
// to WithKey, else a new one.
func keyValue(ctx context.Context) (string, error) {
	key, ok := ctx.Value(keyCtx{}).(string)
	if !ok {
		return NewKey(), nil
	}
	if err := checkKey(key); err != nil {
		return "", err
	}
	if key[0] == '"' || key[0] == ' ' || key[len(key)-1] == ' ' {
		return quote(key), nil
	}
	return key, nil
}

// checkKey applies the kit's rule: 1 to MaxKeyLen bytes of printable ASCII.
func checkKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: longer than %d bytes", ErrInvalidKey, MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return fmt.Errorf("%w: a byte outside printable ASCII at offset %d", ErrInvalidKey, i)
		}
	}
	return nil
}

// quote returns key as an RFC 8941 sf-string.
func quote(key string) string {
	var b strings.Builder
	b.Grow(len(key) + 2 + strings.Count(key, `"`) + strings.Count(key, `\`))
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if key[i] == '"' || key[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}
