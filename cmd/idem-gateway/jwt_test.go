package main

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// The keys of the tests, made once: RSA keys are slow to generate.
var jwtTestKeys = sync.OnceValue(func() (k struct {
	rsa1, rsa2, rsaSmall *rsa.PrivateKey
	p256, p384, p521     *ecdsa.PrivateKey
	ed                   ed25519.PrivateKey
}) {
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	var err error
	k.rsa1, err = rsa.GenerateKey(rand.Reader, 2048)
	must(err)
	k.rsa2, err = rsa.GenerateKey(rand.Reader, 2048)
	must(err)
	k.rsaSmall, err = rsa.GenerateKey(rand.Reader, 1024)
	must(err)
	k.p256, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	k.p384, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	must(err)
	k.p521, err = ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	must(err)
	_, k.ed, err = ed25519.GenerateKey(rand.Reader)
	must(err)
	return k
})

// jwtB64 is base64url without padding.
func jwtB64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// signJWT makes a compact JWS of header (alg added when missing) and claims,
// signed with key: []byte for HS*, *rsa.PrivateKey, *ecdsa.PrivateKey (raw
// r||s) or ed25519.PrivateKey.
func signJWT(t testing.TB, alg string, key any, header, claims map[string]any) string {
	t.Helper()
	h := map[string]any{"alg": alg, "typ": "JWT"}
	for k, v := range header {
		h[k] = v
	}
	hb, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	input := jwtB64(hb) + "." + jwtB64(cb)
	return input + "." + jwtB64(jwtSign(t, alg, key, []byte(input)))
}

// jwtSign signs input as alg does.
func jwtSign(t testing.TB, alg string, key any, input []byte) []byte {
	t.Helper()
	a, known := jwtAlgs[alg]
	var digest []byte
	if known && a.hash != 0 {
		h := a.hash.New()
		h.Write(input)
		digest = h.Sum(nil)
	}
	switch k := key.(type) {
	case []byte:
		hash := crypto.SHA256
		if known {
			hash = a.hash
		}
		m := hmac.New(hash.New, k)
		m.Write(input)
		return m.Sum(nil)
	case *rsa.PrivateKey:
		var sig []byte
		var err error
		if strings.HasPrefix(alg, "PS") { // RSASSA-PSS, salt as long as the hash (RFC 7518 section 3.5)
			sig, err = rsa.SignPSS(rand.Reader, k, a.hash, digest, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash})
		} else {
			sig, err = rsa.SignPKCS1v15(rand.Reader, k, a.hash, digest)
		}
		if err != nil {
			t.Fatal(err)
		}
		return sig
	case *ecdsa.PrivateKey:
		r, s, err := ecdsa.Sign(rand.Reader, k, digest)
		if err != nil {
			t.Fatal(err)
		}
		size := (k.Curve.Params().BitSize + 7) / 8
		sig := make([]byte, 2*size)
		r.FillBytes(sig[:size])
		s.FillBytes(sig[size:])
		return sig
	case ed25519.PrivateKey:
		return ed25519.Sign(k, input)
	}
	t.Fatalf("signJWT: key %T", key)
	return nil
}

// jwkOf is the public JWK of key, with members extra (kid, alg, use...).
func jwkOf(key any, extra map[string]any) map[string]any {
	var m map[string]any
	switch k := key.(type) {
	case *rsa.PrivateKey:
		m = map[string]any{"kty": "RSA", "n": jwtB64(k.N.Bytes()), "e": jwtB64(big.NewInt(int64(k.E)).Bytes())}
	case *ecdsa.PrivateKey:
		size := (k.Curve.Params().BitSize + 7) / 8
		b, err := k.PublicKey.Bytes()
		if err != nil {
			panic(err)
		}
		m = map[string]any{"kty": "EC", "crv": k.Curve.Params().Name, "x": jwtB64(b[1 : 1+size]), "y": jwtB64(b[1+size:])}
	case ed25519.PrivateKey:
		m = map[string]any{"kty": "OKP", "crv": "Ed25519", "x": jwtB64(k.Public().(ed25519.PublicKey))}
	default:
		panic("jwkOf: " + key.(string))
	}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

// jwksJSON is the JSON of a key set of keys.
func jwksJSON(keys ...map[string]any) []byte {
	if keys == nil {
		keys = []map[string]any{}
	}
	b, err := json.Marshal(map[string]any{"keys": keys})
	if err != nil {
		panic(err)
	}
	return b
}

// writeJWTFile writes data in a file of t's temporary directory.
func writeJWTFile(t testing.TB, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// jwtScope is a JWTScope with the decoder's defaults, changed by set.
func jwtScope(set func(*JWTScope)) *JWTScope {
	c := &JWTScope{Claim: "sub", JWKSRefresh: 5 * time.Minute, Leeway: 30 * time.Second}
	if set != nil {
		set(c)
	}
	return c
}

// testClock is a clock that moves when told.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock { return &testClock{t: time.Unix(1_800_000_000, 0)} }

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// bearer is a request carrying token.
func bearer(token string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Authorization", "Bearer "+token)
	return r
}

// newTestJWTVerifier builds a verifier of c on clock, closed at the end of t.
func newTestJWTVerifier(t testing.TB, c *JWTScope, clock *testClock, o jwtOptions) *jwtVerifier {
	t.Helper()
	o.now = clock.now
	v, err := newJWTVerifierOptions(context.Background(), c, nil, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	return v
}

func TestCheckJWT(t *testing.T) {
	t.Setenv("IDEM_TEST_JWT_SECRET", strings.Repeat("s", 32))
	t.Setenv("IDEM_TEST_JWT_SHORT", "short")
	keys := jwtTestKeys()
	secret32 := writeJWTFile(t, "secret32", []byte(strings.Repeat("k", 32)+"\n"))
	secret31 := writeJWTFile(t, "secret31", []byte(strings.Repeat("k", 31)+"\n"))
	secret64 := writeJWTFile(t, "secret64", []byte(strings.Repeat("k", 64)))
	jwks := writeJWTFile(t, "jwks.json", jwksJSON(jwkOf(keys.rsa1, map[string]any{"kid": "a"})))
	jwksEC := writeJWTFile(t, "jwks-ec.json", jwksJSON(jwkOf(keys.p256, nil)))
	jwksEnc := writeJWTFile(t, "jwks-enc.json", jwksJSON(jwkOf(keys.rsa1, map[string]any{"use": "enc"})))
	jwksSmall := writeJWTFile(t, "jwks-small.json", jwksJSON(jwkOf(keys.rsaSmall, nil)))
	jwksRS384 := writeJWTFile(t, "jwks-rs384.json", jwksJSON(jwkOf(keys.rsa1, map[string]any{"alg": "RS384"})))
	jwksEmpty := writeJWTFile(t, "jwks-empty.json", jwksJSON())
	// Moduli of 8193 and 8192 bits (not keys: the bound is checked before any use).
	modulus := func(bits int) string {
		n := new(big.Int).Lsh(big.NewInt(1), uint(bits-1))
		return jwtB64(n.Or(n, big.NewInt(1)).Bytes())
	}
	jwksLarge := writeJWTFile(t, "jwks-large.json", jwksJSON(map[string]any{"kty": "RSA", "n": modulus(8193), "e": "AQAB"}))
	jwks8192 := writeJWTFile(t, "jwks-8192.json", jwksJSON(map[string]any{"kty": "RSA", "n": modulus(8192), "e": "AQAB"}))
	jwksEvenE := writeJWTFile(t, "jwks-even-e.json", jwksJSON(jwkOf(keys.rsa1, map[string]any{"e": jwtB64([]byte{1, 0, 0})})))
	jwksBad := writeJWTFile(t, "jwks-bad.json", []byte("{\"keys\": ["))
	missing := filepath.Join(t.TempDir(), "missing")

	for _, tc := range []struct {
		name   string
		c      *JWTScope
		fields []string // the fields of the problems, in order
		msg    string   // a part of the first problem's message
	}{
		{"nil", nil, nil, ""},
		{"hmac file", jwtScope(func(c *JWTScope) { c.HMACSecretFile = secret32 }), nil, ""},
		{"hmac env", jwtScope(func(c *JWTScope) { c.HMACSecretEnv = "IDEM_TEST_JWT_SECRET" }), nil, ""},
		{"jwks file", jwtScope(func(c *JWTScope) { c.JWKSFile = jwks }), nil, ""},
		{"jwks https", jwtScope(func(c *JWTScope) { c.JWKSURL = "https://issuer.example/.well-known/jwks.json" }), nil, ""},
		{"jwks http 127.0.0.1", jwtScope(func(c *JWTScope) { c.JWKSURL = "http://127.0.0.1:8080/jwks" }), nil, ""},
		{"jwks http ::1", jwtScope(func(c *JWTScope) { c.JWKSURL = "http://[::1]:8080/jwks" }), nil, ""},
		{"jwks http localhost", jwtScope(func(c *JWTScope) { c.JWKSURL = "http://localhost/jwks" }), nil, ""},
		{"no source", jwtScope(nil), []string{""}, "declare one key source"},
		{"two sources", jwtScope(func(c *JWTScope) { c.HMACSecretFile, c.JWKSURL = secret32, "https://x.example/jwks" }), []string{""}, "hmac_secret_file and jwks_url"},
		{"file and env", jwtScope(func(c *JWTScope) { c.HMACSecretFile, c.HMACSecretEnv = secret32, "IDEM_TEST_JWT_SECRET" }), []string{""}, "exactly one"},
		{"short secret", jwtScope(func(c *JWTScope) { c.HMACSecretFile = secret31 }), []string{"hmac_secret_file"}, "31 bytes; want at least 32"},
		{"short env", jwtScope(func(c *JWTScope) { c.HMACSecretEnv = "IDEM_TEST_JWT_SHORT" }), []string{"hmac_secret_env"}, "at least 32"},
		{"missing file", jwtScope(func(c *JWTScope) { c.HMACSecretFile = missing }), []string{"hmac_secret_file"}, "no such file"},
		{"unset env", jwtScope(func(c *JWTScope) { c.HMACSecretEnv = "IDEM_TEST_JWT_UNSET" }), []string{"hmac_secret_env"}, "IDEM_TEST_JWT_UNSET is not set"},
		{"HS512 short secret", jwtScope(func(c *JWTScope) { c.HMACSecretFile, c.Algorithms = secret32, []string{"HS256", "HS512"} }), []string{"algorithms[1]"}, "at least 64 bytes"},
		{"HS512 long secret", jwtScope(func(c *JWTScope) { c.HMACSecretFile, c.Algorithms = secret64, []string{"HS512"} }), nil, ""},
		{"jwks missing", jwtScope(func(c *JWTScope) { c.JWKSFile = missing }), []string{"jwks_file"}, "no such file"},
		{"jwks malformed", jwtScope(func(c *JWTScope) { c.JWKSFile = jwksBad }), []string{"jwks_file"}, "not a JSON Web Key Set"},
		{"jwks empty", jwtScope(func(c *JWTScope) { c.JWKSFile = jwksEmpty }), []string{"jwks_file"}, "no key"},
		{"jwks enc only", jwtScope(func(c *JWTScope) { c.JWKSFile = jwksEnc }), []string{"jwks_file"}, `use "enc"`},
		{"jwks small rsa", jwtScope(func(c *JWTScope) { c.JWKSFile = jwksSmall }), []string{"jwks_file"}, "1024 bits"},
		{"jwks large rsa", jwtScope(func(c *JWTScope) { c.JWKSFile = jwksLarge }), []string{"jwks_file"}, "8193 bits; want 2048 to 8192"},
		{"jwks rsa 8192 bits", jwtScope(func(c *JWTScope) { c.JWKSFile = jwks8192 }), nil, ""},
		{"jwks rsa even exponent", jwtScope(func(c *JWTScope) { c.JWKSFile = jwksEvenE }), []string{"jwks_file"}, "exponent"},
		{"jwks no key for algorithms", jwtScope(func(c *JWTScope) { c.JWKSFile, c.Algorithms = jwksEC, []string{"RS256"} }), []string{"jwks_file"}, "no algorithm"},
		{"jwks key alg not listed", jwtScope(func(c *JWTScope) { c.JWKSFile, c.Algorithms = jwksRS384, []string{"RS256"} }), []string{"jwks_file"}, "alg RS384 not among the algorithms"},
		{"jwks key alg listed", jwtScope(func(c *JWTScope) { c.JWKSFile, c.Algorithms = jwksRS384, []string{"RS256", "RS384"} }), nil, ""},
		{"jwks http remote", jwtScope(func(c *JWTScope) { c.JWKSURL = "http://issuer.example/jwks" }), []string{"jwks_url"}, "loopback"},
		{"jwks relative", jwtScope(func(c *JWTScope) { c.JWKSURL = "/jwks" }), []string{"jwks_url"}, "absolute"},
		{"jwks ftp", jwtScope(func(c *JWTScope) { c.JWKSURL = "ftp://issuer.example/jwks" }), []string{"jwks_url"}, "https"},
		{"claim empty", jwtScope(func(c *JWTScope) { c.HMACSecretFile, c.Claim = secret32, "" }), []string{"claim"}, "empty"},
		{"alg none", jwtScope(func(c *JWTScope) { c.HMACSecretFile, c.Algorithms = secret32, []string{"none"} }), []string{"algorithms[0]"}, "never"},
		{"alg unknown", jwtScope(func(c *JWTScope) { c.JWKSFile, c.Algorithms = jwks, []string{"RS256", "XS1"} }), []string{"algorithms[1]"}, "unknown"},
		{"alg twice", jwtScope(func(c *JWTScope) { c.JWKSFile, c.Algorithms = jwks, []string{"RS256", "RS256"} }), []string{"algorithms[1]"}, "twice"},
		{"alg HS with jwks", jwtScope(func(c *JWTScope) { c.JWKSFile, c.Algorithms = jwks, []string{"RS256", "HS256"} }), []string{"algorithms[1]"}, "HMAC secret"},
		{"alg HS with jwks url", jwtScope(func(c *JWTScope) { c.JWKSURL, c.Algorithms = "https://x.example/jwks", []string{"HS256"} }), []string{"algorithms[0]"}, "public keys only"},
		{"alg RS with hmac", jwtScope(func(c *JWTScope) { c.HMACSecretFile, c.Algorithms = secret32, []string{"RS256"} }), []string{"algorithms[0]"}, "public keys"},
		{"alg empty list", jwtScope(func(c *JWTScope) { c.HMACSecretFile, c.Algorithms = secret32, []string{} }), []string{"algorithms"}, "empty"},
		{"refresh short", jwtScope(func(c *JWTScope) { c.HMACSecretFile, c.JWKSRefresh = secret32, 9*time.Second }), []string{"jwks_refresh"}, "10s"},
		{"refresh 10s", jwtScope(func(c *JWTScope) { c.JWKSURL, c.JWKSRefresh = "https://x.example/jwks", 10*time.Second }), nil, ""},
		{"leeway negative", jwtScope(func(c *JWTScope) { c.HMACSecretFile, c.Leeway = secret32, -time.Second }), []string{"leeway"}, "between"},
		{"leeway 0", jwtScope(func(c *JWTScope) { c.HMACSecretFile, c.Leeway = secret32, 0 }), nil, ""},
		{"leeway 5m", jwtScope(func(c *JWTScope) { c.HMACSecretFile, c.Leeway = secret32, 5*time.Minute }), nil, ""},
		{"leeway long", jwtScope(func(c *JWTScope) { c.HMACSecretFile, c.Leeway = secret32, 5*time.Minute+1 }), []string{"leeway"}, "5m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := checkJWT(tc.c)
			var fields []string
			for _, p := range ps {
				fields = append(fields, p.Field)
			}
			if !slices.Equal(fields, tc.fields) {
				t.Fatalf("problems %q, want fields %q", ps, tc.fields)
			}
			if tc.msg != "" && !strings.Contains(ps[0].Msg, tc.msg) {
				t.Errorf("problem %q, want it to say %q", ps[0], tc.msg)
			}
			for _, p := range ps {
				if strings.Contains(p.Msg, strings.Repeat("s", 32)) || strings.Contains(p.Msg, strings.Repeat("k", 31)) {
					t.Errorf("problem %q shows the secret", p)
				}
			}
			// A verifier is built from what checkJWT accepts, and refused otherwise.
			if tc.c == nil || tc.c.JWKSURL != "" {
				return
			}
			v, err := newJWTVerifier(context.Background(), tc.c, nil)
			if (err == nil) != (len(ps) == 0) {
				t.Fatalf("newJWTVerifier: %v, with problems %q", err, ps)
			}
			if v != nil {
				v.Close()
			}
		})
	}
}

func TestJWTHMAC(t *testing.T) {
	secret := []byte(strings.Repeat("k", 32))
	file := writeJWTFile(t, "secret", append(slices.Clone(secret), '\n'))
	clock := newTestClock()
	now := clock.now().Unix()
	v := newTestJWTVerifier(t, jwtScope(func(c *JWTScope) {
		c.HMACSecretFile = file
		c.Issuer = "https://issuer.example"
		c.Audience = "gateway"
	}), clock, jwtOptions{})

	claims := func(set map[string]any) map[string]any {
		c := map[string]any{"sub": "alice", "exp": now + 60, "iat": now, "iss": "https://issuer.example", "aud": "gateway"}
		for k, x := range set {
			if x == nil {
				delete(c, k)
			} else {
				c[k] = x
			}
		}
		return c
	}
	hs := func(set map[string]any) string { return signJWT(t, "HS256", secret, nil, claims(set)) }
	valid := hs(nil)
	parts := strings.Split(valid, ".")
	signedInput := func(input string) string { return input + "." + jwtB64(jwtSign(t, "HS256", secret, []byte(input))) }

	for _, tc := range []struct {
		name  string
		token string
		want  error  // nil: accepted
		msg   string // with want nil and msg set: refused with a message holding msg
	}{
		{"valid", valid, nil, ""},
		{"wrong secret", signJWT(t, "HS256", []byte(strings.Repeat("x", 32)), nil, claims(nil)), errJWTSignature, ""},
		{"tampered payload", parts[0] + "." + jwtB64([]byte(`{"sub":"mallory","exp":9999999999}`)) + "." + parts[2], errJWTSignature, ""},
		{"alg none", jwtB64([]byte(`{"alg":"none"}`)) + "." + parts[1] + ".", errJWTNone, ""},
		{"alg None", jwtB64([]byte(`{"alg":"None"}`)) + "." + parts[1] + "." + parts[2], errJWTNone, ""},
		{"alg HS512 beyond the secret", signJWT(t, "HS512", secret, nil, claims(nil)), errJWTAlg, ""},
		{"alg RS256 with a secret", signJWT(t, "RS256", secret, nil, claims(nil)), errJWTAlg, ""},
		{"alg unknown", signJWT(t, "HS1", secret, nil, claims(nil)), errJWTAlg, ""},
		{"no alg", jwtB64([]byte(`{"typ":"JWT"}`)) + "." + parts[1] + "." + parts[2], errJWTHeader, ""},
		{"header not json", jwtB64([]byte(`alg`)) + "." + parts[1] + "." + parts[2], errJWTHeader, ""},
		{"crit", signJWT(t, "HS256", secret, map[string]any{"crit": []string{"exp"}}, claims(nil)), errJWTCrit, ""},
		{"padding", valid + "=", errJWTMalformed, ""},
		{"padded header", parts[0] + "==." + parts[1] + "." + parts[2], errJWTMalformed, ""},
		{"standard base64", parts[0] + "." + parts[1] + ".+" + parts[2][1:], errJWTMalformed, ""},
		{"two parts", parts[0] + "." + parts[1], errJWTMalformed, ""},
		{"five parts (JWE)", valid + ".a.b", errJWTMalformed, ""},
		{"payload not an object", signJWT(t, "HS256", secret, nil, nil), errJWTPayload, ""},
		{"no exp", hs(map[string]any{"exp": nil}), errJWTNoExp, ""},
		{"exp not a number", hs(map[string]any{"exp": "tomorrow"}), nil, "exp is not a number"},
		{"expired", hs(map[string]any{"exp": now - 31}), errJWTExpired, ""},
		{"expired at the leeway", hs(map[string]any{"exp": now - 30}), errJWTExpired, ""},
		{"expired within the leeway", hs(map[string]any{"exp": now - 29}), nil, ""},
		{"exp fractional", hs(map[string]any{"exp": float64(now) + 0.5}), nil, ""},
		{"exp far future", hs(map[string]any{"exp": 1e300}), nil, ""},
		{"exp far past", hs(map[string]any{"exp": -1e300}), errJWTExpired, ""},
		{"exp too large for a float", hs(map[string]any{"exp": json.Number("1e400")}), nil, "exp is not a number"},
		{"nbf far future", hs(map[string]any{"nbf": 1e300}), errJWTNotYet, ""},
		{"nbf not a number", hs(map[string]any{"nbf": "now"}), nil, "nbf is not a number"},
		{"iat far future", hs(map[string]any{"iat": 1e300}), errJWTFuture, ""},
		{"nbf in the future", hs(map[string]any{"nbf": now + 31}), errJWTNotYet, ""},
		{"nbf within the leeway", hs(map[string]any{"nbf": now + 30}), nil, ""},
		{"iat in the future", hs(map[string]any{"iat": now + 31}), errJWTFuture, ""},
		{"iat within the leeway", hs(map[string]any{"iat": now + 30}), nil, ""},
		{"iat not a number", hs(map[string]any{"iat": true}), nil, "iat is not a number"},
		{"no iss", hs(map[string]any{"iss": nil}), errJWTIssuer, ""},
		{"other iss", hs(map[string]any{"iss": "https://evil.example"}), errJWTIssuer, ""},
		{"empty iss", hs(map[string]any{"iss": ""}), errJWTIssuer, ""},
		{"iss not a string", hs(map[string]any{"iss": []string{"https://issuer.example"}}), errJWTIssuer, ""},
		{"iss and aud wrong", hs(map[string]any{"iss": "other", "aud": "other"}), errJWTIssuer, ""},
		{"expired, iss wrong", hs(map[string]any{"exp": now - 60, "iss": "other"}), errJWTExpired, ""},
		{"no aud", hs(map[string]any{"aud": nil}), errJWTAudience, ""},
		{"other aud", hs(map[string]any{"aud": "other"}), errJWTAudience, ""},
		{"aud array", hs(map[string]any{"aud": []string{"other", "gateway"}}), nil, ""},
		{"aud array without", hs(map[string]any{"aud": []string{"other"}}), errJWTAudience, ""},
		{"aud number", hs(map[string]any{"aud": 1}), errJWTAudience, ""},
		{"aud empty", hs(map[string]any{"aud": ""}), errJWTAudience, ""},
		{"aud empty array", hs(map[string]any{"aud": []string{}}), errJWTAudience, ""},
		{"aud array with a number", hs(map[string]any{"aud": []any{"gateway", 1}}), errJWTAudience, ""},
		{"kid not a string", signJWT(t, "HS256", secret, map[string]any{"kid": 1}, claims(nil)), errJWTHeader, ""},
		{"crit null", signJWT(t, "HS256", secret, map[string]any{"crit": nil}, claims(nil)), errJWTCrit, ""},
		{"payload an array", signedInput(parts[0] + "." + jwtB64([]byte(`[1]`))), errJWTPayload, ""},
		{"no sub", hs(map[string]any{"sub": nil}), nil, "without the claim sub"},
		{"sub number", hs(map[string]any{"sub": 42}), nil, "sub is not a string"},
		{"sub empty", hs(map[string]any{"sub": ""}), nil, "sub is empty"},
		{"sub 255 bytes", hs(map[string]any{"sub": strings.Repeat("a", 255)}), nil, ""},
		{"sub 256 bytes", hs(map[string]any{"sub": strings.Repeat("a", 256)}), nil, "longer than 255 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := v.Principal(bearer(tc.token))
			switch {
			case tc.want == nil && tc.msg == "":
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if wantP := principalOf(tc.token); p != wantP {
					t.Fatalf("principal %q, want %q", p, wantP)
				}
				return
			case err == nil:
				t.Fatalf("accepted, principal %q", p)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("refused with %q, want %q", err, tc.want)
			case tc.msg != "" && !strings.Contains(err.Error(), tc.msg):
				t.Fatalf("refused with %q, want it to say %q", err, tc.msg)
			case errors.Is(err, errNoToken):
				t.Fatalf("refused as no token: %v", err)
			}
			if p != "" {
				t.Errorf("principal %q with the error %v", p, err)
			}
			if msg := err.Error(); strings.Contains(msg, "alice") || strings.Contains(msg, "aaaa") || strings.Contains(msg, tc.token) {
				t.Errorf("the error %q shows the token or a claim", msg)
			}
		})
	}
}

// principalOf is the sub claim of token, read without verifying it.
func principalOf(token string) string {
	b, _ := base64.RawURLEncoding.DecodeString(strings.Split(token, ".")[1])
	var c struct{ Sub string }
	json.Unmarshal(b, &c)
	return c.Sub
}

func TestJWTHMACEnvAndAlgorithms(t *testing.T) {
	secret := strings.Repeat("e", 64)
	t.Setenv("IDEM_TEST_JWT_SECRET", secret)
	clock := newTestClock()
	claims := map[string]any{"uid": "bob", "exp": clock.now().Unix() + 60}
	for _, tc := range []struct {
		algorithms []string
		accepted   []string
	}{
		{nil, []string{"HS256", "HS384", "HS512"}}, // a 64-byte secret allows them all
		{[]string{"HS512"}, []string{"HS512"}},
	} {
		v := newTestJWTVerifier(t, jwtScope(func(c *JWTScope) {
			c.HMACSecretEnv = "IDEM_TEST_JWT_SECRET"
			c.Claim = "uid"
			c.Algorithms = tc.algorithms
		}), clock, jwtOptions{})
		for _, alg := range []string{"HS256", "HS384", "HS512"} {
			p, err := v.Principal(bearer(signJWT(t, alg, []byte(secret), nil, claims)))
			if want := slices.Contains(tc.accepted, alg); want != (err == nil) || want && p != "bob" {
				t.Errorf("algorithms %q, %s: %q, %v", tc.algorithms, alg, p, err)
			}
		}
	}
	// A 32-byte secret allows HS256 only, by default; a 48-byte one HS384 too.
	for n, accepted := range map[int][]string{32: {"HS256"}, 48: {"HS256", "HS384"}} {
		s := []byte(secret[:n])
		v := newTestJWTVerifier(t, jwtScope(func(c *JWTScope) {
			c.HMACSecretFile = writeJWTFile(t, "secret", s)
			c.Claim = "uid"
		}), clock, jwtOptions{})
		for _, alg := range []string{"HS256", "HS384", "HS512"} {
			_, err := v.Principal(bearer(signJWT(t, alg, s, nil, claims)))
			if want := slices.Contains(accepted, alg); want != (err == nil) {
				t.Errorf("%d-byte secret, %s: %v", n, alg, err)
			}
		}
	}
}

func TestJWTBearerHeader(t *testing.T) {
	secret := []byte(strings.Repeat("k", 32))
	clock := newTestClock()
	v := newTestJWTVerifier(t, jwtScope(func(c *JWTScope) { c.HMACSecretFile = writeJWTFile(t, "secret", secret) }), clock, jwtOptions{})
	token := signJWT(t, "HS256", secret, nil, map[string]any{"sub": "alice", "exp": clock.now().Unix() + 60})
	for _, tc := range []struct {
		name    string
		headers []string
		want    error // nil: accepted
	}{
		{"Bearer", []string{"Bearer " + token}, nil},
		{"bearer", []string{"bearer " + token}, nil},
		{"BEARER and spaces", []string{"  BEARER   " + token + " "}, nil},
		{"none", nil, errNoToken},
		{"Basic", []string{"Basic YWxpY2U6c2VjcmV0"}, errNoToken},
		{"empty", []string{""}, errNoToken},
		{"Bearer alone", []string{"Bearer"}, errNoToken},
		{"Bearer empty", []string{"Bearer  "}, errNoToken},
		{"token without scheme", []string{token}, errNoToken},
		{"two headers", []string{"Bearer " + token, "Bearer " + token}, errJWTAuthHeaders},
		{"too long", []string{"Bearer " + strings.Repeat("a", jwtMaxToken+1)}, errJWTTooLong},
		{"not a token", []string{"Bearer abc"}, errJWTMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			for _, h := range tc.headers {
				r.Header.Add("Authorization", h)
			}
			p, err := v.Principal(r)
			if !errors.Is(err, tc.want) || tc.want == nil && p != "alice" {
				t.Fatalf("%q, %v; want %v", p, err, tc.want)
			}
			if tc.want != errNoToken && errors.Is(err, errNoToken) {
				t.Fatalf("%v is errNoToken", err)
			}
		})
	}
}

func TestJWTAlgorithms(t *testing.T) {
	keys := jwtTestKeys()
	clock := newTestClock()
	claims := map[string]any{"sub": "alice", "exp": clock.now().Unix() + 60}
	for _, tc := range []struct {
		alg string
		key any
	}{
		{"RS256", keys.rsa1}, {"RS384", keys.rsa1}, {"RS512", keys.rsa1},
		{"PS256", keys.rsa1}, {"PS384", keys.rsa1}, {"PS512", keys.rsa1},
		{"ES256", keys.p256}, {"ES384", keys.p384}, {"ES512", keys.p521},
		{"EdDSA", keys.ed},
	} {
		t.Run(tc.alg, func(t *testing.T) {
			file := writeJWTFile(t, "jwks.json", jwksJSON(jwkOf(tc.key, map[string]any{"kid": "k", "use": "sig"})))
			v := newTestJWTVerifier(t, jwtScope(func(c *JWTScope) { c.JWKSFile = file }), clock, jwtOptions{})
			token := signJWT(t, tc.alg, tc.key, map[string]any{"kid": "k"}, claims)
			if p, err := v.Principal(bearer(token)); err != nil || p != "alice" {
				t.Fatalf("%q, %v", p, err)
			}
			// Without kid: the only key of the set.
			if p, err := v.Principal(bearer(signJWT(t, tc.alg, tc.key, nil, claims))); err != nil || p != "alice" {
				t.Fatalf("without kid: %q, %v", p, err)
			}
			// A signature changed in its last byte.
			sig, _ := base64.RawURLEncoding.DecodeString(token[strings.LastIndex(token, ".")+1:])
			sig[len(sig)-1] ^= 1
			bad := token[:strings.LastIndex(token, ".")+1] + jwtB64(sig)
			if _, err := v.Principal(bearer(bad)); !errors.Is(err, errJWTSignature) {
				t.Fatalf("changed signature: %v", err)
			}
			// The alg confusion attack: HS256 signed with the public key, as
			// JSON or as its bytes, for a secret.
			pub := jwkOf(tc.key, nil)
			pubJSON, _ := json.Marshal(pub)
			raw, _ := pub["n"].(string)
			if raw == "" {
				raw = pub["x"].(string)
			}
			for _, secret := range []string{string(pubJSON), raw} {
				for _, alg := range []string{"HS256", "HS384", "HS512"} {
					_, err := v.Principal(bearer(signJWT(t, alg, []byte(secret), map[string]any{"kid": "k"}, claims)))
					if !errors.Is(err, errJWTAlg) {
						t.Fatalf("%s signed with the public key: %v", alg, err)
					}
				}
			}
			// Listed algorithms restrict those the keys allow.
			w := newTestJWTVerifier(t, jwtScope(func(c *JWTScope) { c.JWKSFile, c.Algorithms = file, []string{tc.alg} }), clock, jwtOptions{})
			if _, err := w.Principal(bearer(token)); err != nil {
				t.Fatalf("listed: %v", err)
			}
			if strings.HasPrefix(tc.alg, "RS") || strings.HasPrefix(tc.alg, "PS") {
				other := "RS256"
				if tc.alg == other {
					other = "PS512"
				}
				if _, err := w.Principal(bearer(signJWT(t, other, tc.key, nil, claims))); !errors.Is(err, errJWTAlg) {
					t.Fatalf("%s not listed: %v", other, err)
				}
			}
		})
	}
}

// jwtWithSignature replaces the signature of token by sig.
func jwtWithSignature(token string, sig []byte) string {
	return token[:strings.LastIndex(token, ".")+1] + jwtB64(sig)
}

func TestJWTECDSASignatureForm(t *testing.T) {
	keys := jwtTestKeys()
	clock := newTestClock()
	file := writeJWTFile(t, "jwks.json", jwksJSON(jwkOf(keys.p256, nil)))
	v := newTestJWTVerifier(t, jwtScope(func(c *JWTScope) { c.JWKSFile = file }), clock, jwtOptions{})
	token := signJWT(t, "ES256", keys.p256, nil, map[string]any{"sub": "alice", "exp": clock.now().Unix() + 60})
	if _, err := v.Principal(bearer(token)); err != nil {
		t.Fatal(err)
	}
	input := token[:strings.LastIndex(token, ".")]
	digest := crypto.SHA256.New()
	digest.Write([]byte(input))
	der, err := ecdsa.SignASN1(rand.Reader, keys.p256, digest.Sum(nil))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(token[len(input)+1:])
	for name, sig := range map[string][]byte{
		"DER":          der,
		"short":        raw[:63],
		"long":         append(slices.Clone(raw), 0),
		"ES512 length": append(slices.Clone(raw), make([]byte, 68)...),
		"empty":        nil,
	} {
		if _, err := v.Principal(bearer(jwtWithSignature(token, sig))); !errors.Is(err, errJWTSignature) {
			t.Errorf("%s signature: %v", name, err)
		}
	}
}

func TestJWTKeySelection(t *testing.T) {
	keys := jwtTestKeys()
	clock := newTestClock()
	claims := map[string]any{"sub": "alice", "exp": clock.now().Unix() + 60}
	file := writeJWTFile(t, "jwks.json", jwksJSON(
		jwkOf(keys.rsa1, map[string]any{"kid": "a"}),
		jwkOf(keys.rsa2, map[string]any{"kid": "b", "alg": "RS384"}),
		jwkOf(keys.p256, map[string]any{"kid": "ec"}),
		jwkOf(keys.rsa1, map[string]any{"kid": "enc", "use": "enc"}),
		jwkOf(keys.rsaSmall, map[string]any{"kid": "small"}),
		jwkOf(keys.rsa1, map[string]any{"kid": "noverify", "key_ops": []string{"encrypt"}}),
		map[string]any{"kty": "oct", "kid": "oct", "k": jwtB64([]byte(strings.Repeat("k", 32)))},
		map[string]any{"kty": "EC", "kid": "bad-point", "crv": "P-256", "x": jwtB64(make([]byte, 32)), "y": jwtB64(make([]byte, 32))},
		map[string]any{"kty": "OKP", "kid": "x25519", "crv": "X25519", "x": jwtB64(make([]byte, 32))},
		jwkOf(keys.p384, map[string]any{"kid": "ec-wrong-alg", "alg": "ES256"}),
	))
	v := newTestJWTVerifier(t, jwtScope(func(c *JWTScope) { c.JWKSFile = file }), clock, jwtOptions{})
	if n := len(*v.keys.Load()); n != 3 {
		t.Fatalf("%d usable keys, want 3 (a, b, ec)", n)
	}
	for _, tc := range []struct {
		name  string
		token string
		want  error
	}{
		{"kid a", signJWT(t, "RS256", keys.rsa1, map[string]any{"kid": "a"}, claims), nil},
		{"kid b", signJWT(t, "RS384", keys.rsa2, map[string]any{"kid": "b"}, claims), nil},
		{"kid b signed by a", signJWT(t, "RS384", keys.rsa1, map[string]any{"kid": "b"}, claims), errJWTSignature},
		{"kid b with an alg not its own", signJWT(t, "RS256", keys.rsa2, map[string]any{"kid": "b"}, claims), errJWTKidAlg},
		{"kid ec with RS256", signJWT(t, "RS256", keys.rsa1, map[string]any{"kid": "ec"}, claims), errJWTKidAlg},
		{"no kid, one EC key", signJWT(t, "ES256", keys.p256, nil, claims), nil},
		{"no kid, RS256 fits only a", signJWT(t, "RS256", keys.rsa1, nil, claims), nil},
		{"no kid, PS256 fits only a", signJWT(t, "PS256", keys.rsa1, nil, claims), nil},
		{"no kid, no key for ES384", signJWT(t, "ES384", keys.p384, nil, claims), errJWTNoKey},
		{"kid enc (ignored)", signJWT(t, "RS256", keys.rsa1, map[string]any{"kid": "enc"}, claims), errJWTUnknownKid},
		{"kid small (skipped)", signJWT(t, "RS256", keys.rsaSmall, map[string]any{"kid": "small"}, claims), errJWTUnknownKid},
		{"kid noverify", signJWT(t, "RS256", keys.rsa1, map[string]any{"kid": "noverify"}, claims), errJWTUnknownKid},
		{"kid oct", signJWT(t, "HS256", []byte(strings.Repeat("k", 32)), map[string]any{"kid": "oct"}, claims), errJWTAlg},
		{"kid ec-wrong-alg", signJWT(t, "ES384", keys.p384, map[string]any{"kid": "ec-wrong-alg"}, claims), errJWTUnknownKid},
		{"unknown kid", signJWT(t, "RS256", keys.rsa1, map[string]any{"kid": "z"}, claims), errJWTUnknownKid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := v.Principal(bearer(tc.token)); !errors.Is(err, tc.want) {
				t.Fatalf("%v, want %v", err, tc.want)
			}
		})
	}

	// Two RSA keys that both fit RS256: a token without kid is refused.
	two := writeJWTFile(t, "two.json", jwksJSON(jwkOf(keys.rsa1, map[string]any{"kid": "a"}), jwkOf(keys.rsa2, map[string]any{"kid": "b"})))
	w := newTestJWTVerifier(t, jwtScope(func(c *JWTScope) { c.JWKSFile = two }), clock, jwtOptions{})
	if _, err := w.Principal(bearer(signJWT(t, "RS256", keys.rsa1, nil, claims))); !errors.Is(err, errJWTNeedKid) {
		t.Fatalf("no kid, two keys: %v", err)
	}
}

// jwksServer serves a key set that tests change, counting the requests.
type jwksServer struct {
	*httptest.Server
	body    atomic.Pointer[[]byte] // nil: 500
	fetches atomic.Int32
}

func newJWKSServer(t testing.TB, body []byte) *jwksServer {
	s := &jwksServer{}
	s.serve(body)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fetches.Add(1)
		b := s.body.Load()
		if b == nil {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Write(*b)
	}))
	t.Cleanup(s.Close)
	return s
}

// serve makes body the set served; nil makes the server answer 500.
func (s *jwksServer) serve(body []byte) {
	if body == nil {
		s.body.Store(nil)
		return
	}
	s.body.Store(&body)
}

func TestJWTURLRefresh(t *testing.T) {
	keys := jwtTestKeys()
	clock := newTestClock()
	claims := map[string]any{"sub": "alice", "exp": clock.now().Unix() + 60}
	srv := newJWKSServer(t, jwksJSON(jwkOf(keys.rsa1, map[string]any{"kid": "k1"})))
	tick := make(chan time.Time)
	refreshed := make(chan error)
	v := newTestJWTVerifier(t, jwtScope(func(c *JWTScope) { c.JWKSURL = srv.URL + "/jwks" }), clock, jwtOptions{
		tick:      tick,
		refreshed: func(err error) { refreshed <- err },
	})
	failures := make(chan error, 10)
	v.OnRefreshError(func(err error) { failures <- err })
	k1 := signJWT(t, "RS256", keys.rsa1, map[string]any{"kid": "k1"}, claims)
	k2 := signJWT(t, "ES256", keys.p256, map[string]any{"kid": "k2"}, claims)
	if n := srv.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches at the start, want 1", n)
	}
	if _, err := v.Principal(bearer(k1)); err != nil {
		t.Fatal(err)
	}

	// The set rotates to k2; a refresh takes it.
	srv.serve(jwksJSON(jwkOf(keys.p256, map[string]any{"kid": "k2"})))
	tick <- time.Time{}
	if err := <-refreshed; err != nil {
		t.Fatal(err)
	}
	if _, err := v.Principal(bearer(k2)); err != nil {
		t.Fatalf("k2 after the refresh: %v", err)
	}
	if _, err := v.Principal(bearer(k1)); !errors.Is(err, errJWTUnknownKid) {
		t.Fatalf("k1 after the refresh: %v", err)
	}

	// The server fails: the refresh is reported and the set stays.
	srv.serve(nil)
	tick <- time.Time{}
	if err := <-refreshed; err == nil || !strings.Contains(err.Error(), "500") {
		t.Fatalf("refresh from a failing server: %v", err)
	}
	if err := <-failures; !strings.Contains(err.Error(), "500") {
		t.Fatalf("reported: %v", err)
	}
	if _, err := v.Principal(bearer(k2)); err != nil {
		t.Fatalf("k2 after a failed refresh: %v", err)
	}

	// A set without a usable key is a failure too.
	srv.serve(jwksJSON(jwkOf(keys.rsaSmall, map[string]any{"kid": "k3"})))
	tick <- time.Time{}
	if err := <-refreshed; err == nil || !strings.Contains(err.Error(), "no usable key") {
		t.Fatalf("refresh to a set without a usable key: %v", err)
	}
	<-failures
	if _, err := v.Principal(bearer(k2)); err != nil {
		t.Fatalf("k2 after a set without a usable key: %v", err)
	}

	// Close stops the refresher (it no longer takes ticks) and may be repeated;
	// the last set still verifies.
	v.Close()
	v.Close()
	select {
	case tick <- time.Time{}:
		t.Fatal("a tick taken after Close")
	default:
	}
	if _, err := v.Principal(bearer(k2)); err != nil {
		t.Fatalf("after Close: %v", err)
	}
}

func TestJWTUnknownKidRefetch(t *testing.T) {
	keys := jwtTestKeys()
	clock := newTestClock()
	claims := map[string]any{"sub": "alice", "exp": clock.now().Unix() + 3600}
	srv := newJWKSServer(t, jwksJSON(jwkOf(keys.rsa1, map[string]any{"kid": "old"})))
	v := newTestJWTVerifier(t, jwtScope(func(c *JWTScope) { c.JWKSURL = srv.URL }), clock, jwtOptions{tick: make(chan time.Time)})
	failures := make(chan error, 10)
	v.OnRefreshError(func(err error) { failures <- err })
	fresh := signJWT(t, "RS256", keys.rsa2, map[string]any{"kid": "new"}, claims)
	old := signJWT(t, "RS256", keys.rsa1, map[string]any{"kid": "old"}, claims)
	want := func(fetches int32, token string, wantErr error) {
		t.Helper()
		if _, err := v.Principal(bearer(token)); !errors.Is(err, wantErr) {
			t.Fatalf("%v, want %v", err, wantErr)
		}
		if n := srv.fetches.Load(); n != fetches {
			t.Fatalf("%d fetches, want %d", n, fetches)
		}
	}
	want(1, old, nil)
	want(2, fresh, errJWTUnknownKid) // fetched once: still unknown
	want(2, fresh, errJWTUnknownKid) // not again within the minute
	srv.serve(jwksJSON(jwkOf(keys.rsa1, map[string]any{"kid": "old"}), jwkOf(keys.rsa2, map[string]any{"kid": "new"})))
	clock.advance(59 * time.Second)
	want(2, fresh, errJWTUnknownKid)
	want(2, old, nil) // a known kid fetches nothing
	clock.advance(time.Second)
	want(3, fresh, nil) // a minute later: fetched, and known
	want(3, fresh, nil)

	// Many requests with an unknown kid at once fetch once.
	clock.advance(time.Minute)
	unknown := signJWT(t, "RS256", keys.rsa2, map[string]any{"kid": "unknown"}, claims)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := v.Principal(bearer(unknown)); !errors.Is(err, errJWTUnknownKid) {
				t.Errorf("%v", err)
			}
		})
	}
	wg.Wait()
	if n := srv.fetches.Load(); n != 4 {
		t.Fatalf("%d fetches after 8 concurrent unknown kids, want 4", n)
	}

	// A refetch that fails keeps the set, and is reported.
	srv.serve(nil)
	clock.advance(time.Minute)
	want(5, unknown, errJWTUnknownKid)
	if err := <-failures; !strings.Contains(err.Error(), "500") {
		t.Fatalf("reported: %v", err)
	}
	want(5, old, nil)

	// After Close, an unknown kid fetches nothing.
	v.Close()
	clock.advance(time.Minute)
	srv.serve(jwksJSON(jwkOf(keys.rsa2, map[string]any{"kid": "unknown"})))
	want(5, unknown, errJWTUnknownKid)
}

func TestJWTURLStart(t *testing.T) {
	keys := jwtTestKeys()
	good := jwksJSON(jwkOf(keys.ed, nil))
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		msg     string // "": built
	}{
		{"ok", func(w http.ResponseWriter, r *http.Request) { w.Write(good) }, ""},
		{"500", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "down", 500) }, "500"},
		{"not json", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("<html>")) }, "not a JSON Web Key Set"},
		{"no usable key", func(w http.ResponseWriter, r *http.Request) { w.Write(jwksJSON(jwkOf(keys.rsaSmall, nil))) }, "no usable key"},
		{"too large", func(w http.ResponseWriter, r *http.Request) { w.Write(make([]byte, jwtMaxJWKS+1)) }, "larger than"},
		{"redirect to http remote", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://jwks.example/keys", http.StatusFound)
		}, "loopback"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			v, err := newJWTVerifier(context.Background(), jwtScope(func(c *JWTScope) { c.JWKSURL = srv.URL }), nil)
			if tc.msg == "" {
				if err != nil {
					t.Fatal(err)
				}
				v.Close()
				return
			}
			if err == nil {
				v.Close()
				t.Fatal("built")
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("%v, want it to say %q", err, tc.msg)
			}
		})
	}

	// The first fetch is bounded by ctx.
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(block)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := newJWTVerifier(ctx, jwtScope(func(c *JWTScope) { c.JWKSURL = srv.URL }), srv.Client()); !errors.Is(err, context.Canceled) && !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("canceled start: %v", err)
	}
}

func TestJWTCloseWithoutURL(t *testing.T) {
	v := newTestJWTVerifier(t, jwtScope(func(c *JWTScope) {
		c.HMACSecretFile = writeJWTFile(t, "secret", []byte(strings.Repeat("k", 32)))
	}), newTestClock(), jwtOptions{})
	v.Close()
	v.Close()
}

// Each algorithm of the gateway is golang-jwt's of the same name, and a
// parser is never built without algorithms (nor with none).
func TestJWTAlgsInLibrary(t *testing.T) {
	if len(jwtAlgNames) != len(jwtAlgs) {
		t.Fatalf("%d names for %d algorithms", len(jwtAlgNames), len(jwtAlgs))
	}
	for _, name := range jwtAlgNames {
		m := jwt.GetSigningMethod(name)
		if _, ok := jwtAlgs[name]; !ok || m == nil || m.Alg() != name {
			t.Errorf("%s: %v in jwtAlgs, golang-jwt's %v", name, ok, m)
		}
	}
	if _, err := jwtParser(jwtScope(nil), map[string]bool{}, time.Now); err == nil {
		t.Fatal("a parser without algorithms")
	}
	if _, err := jwtParser(jwtScope(nil), map[string]bool{"none": true}, time.Now); err == nil {
		t.Fatal("a parser of none")
	}
}
