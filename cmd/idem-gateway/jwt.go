package main

// The verifier of the jwt scope: a bearer token in compact JWS form, signed
// with an HMAC secret or with one of the public keys of a JSON Web Key Set,
// whose claim names the principal. Standard library only.

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rsa"
	_ "crypto/sha256" // SHA-256 for HS256, RS256, PS256, ES256
	_ "crypto/sha512" // SHA-384 and SHA-512 for the 384 and 512 variants
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Limits of the jwt scope.
const (
	jwtMinSecret    = 32               // bytes of an HMAC secret, whatever the algorithm
	jwtMinRefresh   = 10 * time.Second // least jwks_refresh
	jwtMaxLeeway    = 5 * time.Minute  // most leeway
	jwtKidRefetch   = time.Minute      // least time between two fetches for an unknown kid
	jwtFetchTimeout = 10 * time.Second // timeout of the default client of jwks_url
	jwtMaxJWKS      = 1 << 20          // bytes of a JWKS, file or response
	jwtMaxToken     = 16 << 10         // bytes of a bearer token
	jwtMaxPrincipal = 255              // bytes of the principal claim
	jwtMinRSABits   = 2048             // least RSA modulus
	jwtMaxRSABits   = 8192             // largest RSA modulus (bounds the cost of a verification)
)

// jwtAlg describes a JWS algorithm (RFC 7518 section 3, RFC 8037).
type jwtAlg struct {
	hash crypto.Hash // the digest; 0 for EdDSA, which signs the message itself
	kty  string      // the JWK key type: "oct" (HMAC), "RSA", "EC" or "OKP"
	crv  string      // the curve of EC and OKP keys
	pss  bool        // RSASSA-PSS rather than PKCS #1 v1.5
}

// jwtAlgs are the algorithms the gateway knows, by their alg name.
var jwtAlgs = map[string]jwtAlg{
	"HS256": {hash: crypto.SHA256, kty: "oct"},
	"HS384": {hash: crypto.SHA384, kty: "oct"},
	"HS512": {hash: crypto.SHA512, kty: "oct"},
	"RS256": {hash: crypto.SHA256, kty: "RSA"},
	"RS384": {hash: crypto.SHA384, kty: "RSA"},
	"RS512": {hash: crypto.SHA512, kty: "RSA"},
	"PS256": {hash: crypto.SHA256, kty: "RSA", pss: true},
	"PS384": {hash: crypto.SHA384, kty: "RSA", pss: true},
	"PS512": {hash: crypto.SHA512, kty: "RSA", pss: true},
	"ES256": {hash: crypto.SHA256, kty: "EC", crv: "P-256"},
	"ES384": {hash: crypto.SHA384, kty: "EC", crv: "P-384"},
	"ES512": {hash: crypto.SHA512, kty: "EC", crv: "P-521"},
	"EdDSA": {kty: "OKP", crv: "Ed25519"},
}

// jwtAlgNames lists jwtAlgs in the order messages name them.
var jwtAlgNames = []string{
	"HS256", "HS384", "HS512",
	"RS256", "RS384", "RS512",
	"PS256", "PS384", "PS512",
	"ES256", "ES384", "ES512",
	"EdDSA",
}

// jwtProblem is one thing wrong with a JWTScope: Field is the yaml name of
// the field relative to the jwt mapping ("hmac_secret_file",
// "algorithms[1]"), or "" for the mapping as a whole; Msg says what is wrong.
type jwtProblem struct{ Field, Msg string }

// String renders the problem as "field: msg", or msg alone for the mapping.
func (p jwtProblem) String() string {
	if p.Field == "" {
		return p.Msg
	}
	return p.Field + ": " + p.Msg
}

// checkJWT checks a JWTScope's fields as the config validator does, reading
// the secret or the JWKS file it names (jwks_url is not fetched here); each
// problem is reported with the field's yaml name relative to the jwt
// mapping, "" for the mapping as a whole. A nil c has no problems.
//
// The rules: exactly one key source (hmac_secret_file, hmac_secret_env,
// jwks_file, jwks_url); an HMAC secret of at least 32 bytes, and for HS384
// and HS512 named in algorithms at least as long as their digest (48 and 64
// bytes, RFC 7518 section 3.2); a readable file, a set variable; a jwks_file
// holding at least one key usable with the algorithms; a jwks_url that is an
// absolute https URL, or http to a loopback host (127.0.0.1, ::1,
// localhost); a non-empty claim; algorithms among HS256/384/512,
// RS256/384/512, PS256/384/512, ES256/384/512 and EdDSA, each listed once,
// HS* with an HMAC secret only and the others with a JWKS only; jwks_refresh
// at least 10s; leeway between 0 and 5m.
func checkJWT(c *JWTScope) []jwtProblem {
	if c == nil {
		return nil
	}
	var ps []jwtProblem
	add := func(field, format string, args ...any) {
		ps = append(ps, jwtProblem{field, fmt.Sprintf(format, args...)})
	}
	if c.Claim == "" {
		add("claim", "must not be empty (the claim that names the principal, sub by default)")
	}
	if c.JWKSRefresh < jwtMinRefresh {
		add("jwks_refresh", "must be at least %s", jwtMinRefresh)
	}
	if c.Leeway < 0 || c.Leeway > jwtMaxLeeway {
		add("leeway", "must be between 0 and %s", jwtMaxLeeway)
	}

	var sources []string
	for _, s := range []struct{ name, v string }{
		{"hmac_secret_file", c.HMACSecretFile},
		{"hmac_secret_env", c.HMACSecretEnv},
		{"jwks_file", c.JWKSFile},
		{"jwks_url", c.JWKSURL},
	} {
		if s.v != "" {
			sources = append(sources, s.name)
		}
	}
	switch len(sources) {
	case 0:
		add("", "declare one key source: hmac_secret_file, hmac_secret_env, jwks_file or jwks_url")
		return ps
	case 1:
	default:
		add("", "declare exactly one key source, not %s", strings.Join(sources, " and "))
		return ps
	}
	source := sources[0]
	hmacSource := c.HMACSecretFile != "" || c.HMACSecretEnv != ""

	// The algorithms, and those that are valid for the checks below.
	algsOK := true
	seen := map[string]bool{}
	for i, a := range c.Algorithms {
		field := fmt.Sprintf("algorithms[%d]", i)
		alg, known := jwtAlgs[a]
		switch {
		case strings.EqualFold(a, "none"):
			add(field, "none is never accepted: a token must be signed")
		case !known:
			add(field, "%q: unknown algorithm (known: %s)", a, strings.Join(jwtAlgNames, ", "))
		case seen[a]:
			add(field, "%s listed twice", a)
		case hmacSource && alg.kty != "oct":
			add(field, "%s needs public keys (jwks_file or jwks_url); %s allows HS256, HS384 and HS512 only", a, source)
		case !hmacSource && alg.kty == "oct":
			add(field, "%s needs an HMAC secret (hmac_secret_file or hmac_secret_env); a JWKS holds public keys only", a)
		default:
			seen[a] = true
			continue
		}
		algsOK = false
	}
	if c.Algorithms != nil && len(c.Algorithms) == 0 {
		add("algorithms", "must not be empty: leave it out for every algorithm the keys allow")
		algsOK = false
	}

	switch {
	case hmacSource:
		secret, err := jwtSecret(c)
		if err != nil {
			add(source, "%v", err)
			break
		}
		if len(secret) < jwtMinSecret {
			add(source, "the secret has %d bytes; want at least %d", len(secret), jwtMinSecret)
			break
		}
		for i, a := range c.Algorithms {
			if alg, ok := jwtAlgs[a]; ok && alg.kty == "oct" && len(secret) < alg.hash.Size() {
				add(fmt.Sprintf("algorithms[%d]", i), "%s needs a secret of at least %d bytes, %s has %d", a, alg.hash.Size(), source, len(secret))
			}
		}
	case c.JWKSFile != "":
		b, err := readJWKSFile(c.JWKSFile)
		if err != nil {
			add("jwks_file", "%v", err)
			break
		}
		if !algsOK {
			break // which keys are usable depends on the algorithms
		}
		if _, err := parseJWKS(b, jwtAllowed(c, 0)); err != nil {
			add("jwks_file", "%s: %v", c.JWKSFile, err)
		}
	case c.JWKSURL != "":
		if err := checkJWKSURL(c.JWKSURL); err != nil {
			add("jwks_url", "%v", err)
		}
	}
	return ps
}

// jwtSecret reads the HMAC secret of c: the file without its trailing
// newline, or the environment variable as it is.
func jwtSecret(c *JWTScope) ([]byte, error) {
	if c.HMACSecretFile != "" {
		s, err := readSecretFile(c.HMACSecretFile)
		return []byte(s), err
	}
	s := os.Getenv(c.HMACSecretEnv)
	if s == "" {
		return nil, fmt.Errorf("the environment variable %s is not set, or empty", c.HMACSecretEnv)
	}
	return []byte(s), nil
}

// readJWKSFile reads a JWKS file of at most 1 MiB.
func readJWKSFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, jwtMaxJWKS+1))
	if err != nil {
		return nil, err
	}
	if len(b) > jwtMaxJWKS {
		return nil, fmt.Errorf("%s is larger than %d bytes", name, jwtMaxJWKS)
	}
	return b, nil
}

// checkJWKSURL requires an absolute https URL, or http to a loopback host.
func checkJWKSURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if !u.IsAbs() || u.Host == "" {
		return fmt.Errorf("%q: want an absolute URL (https://issuer.example/.well-known/jwks.json)", s)
	}
	switch strings.ToLower(u.Scheme) {
	case "https":
		return nil
	case "http":
		if isLoopback(u.Hostname()) {
			return nil
		}
		return fmt.Errorf("%q: http only to a loopback host (127.0.0.1, ::1, localhost); use https", s)
	default:
		return fmt.Errorf("%q: want https (or http to a loopback host)", s)
	}
}

// isLoopback reports whether host is localhost or a loopback IP address.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// jwtAllowed returns the algorithms c accepts: those listed, or by default
// every one its key source allows (HS256, and HS384 and HS512 when the
// secret of secretLen bytes is as long as their digest, for an HMAC secret;
// the RSA, ECDSA and EdDSA ones for a JWKS).
func jwtAllowed(c *JWTScope, secretLen int) map[string]bool {
	hmacSource := c.HMACSecretFile != "" || c.HMACSecretEnv != ""
	allowed := map[string]bool{}
	if len(c.Algorithms) > 0 {
		for _, a := range c.Algorithms {
			allowed[a] = true
		}
		return allowed
	}
	for name, alg := range jwtAlgs {
		switch {
		case hmacSource && alg.kty == "oct" && secretLen >= alg.hash.Size():
			allowed[name] = true
		case !hmacSource && alg.kty != "oct":
			allowed[name] = true
		}
	}
	return allowed
}

// jwk is a usable public key of a JWKS.
type jwk struct {
	kid string
	alg string // the only algorithm the key may verify; "" for any that fits its type
	kty string
	crv string
	key any // *rsa.PublicKey, *ecdsa.PublicKey or ed25519.PublicKey
}

// fits reports whether the key may verify a token signed with alg.
func (k *jwk) fits(name string, alg jwtAlg) bool {
	return (k.alg == "" || k.alg == name) && k.kty == alg.kty && k.crv == alg.crv
}

// jwkJSON is a member of a JWKS's keys, as RFC 7517 and 7518 spell it.
type jwkJSON struct {
	Kty    string   `json:"kty"`
	Use    string   `json:"use"`
	KeyOps []string `json:"key_ops"`
	Alg    string   `json:"alg"`
	Kid    string   `json:"kid"`
	Crv    string   `json:"crv"`
	N      string   `json:"n"`
	E      string   `json:"e"`
	X      string   `json:"x"`
	Y      string   `json:"y"`
}

// parseJWKS parses a JSON Web Key Set and returns its keys usable for
// verifying a signature with one of the allowed algorithms. Keys whose use
// is enc, whose key_ops lack verify, of an unknown type or curve, malformed,
// RSA keys under 2048 bits, and keys whose alg is not allowed or does not
// fit their type are skipped; none left is an error that says why each was.
func parseJWKS(b []byte, allowed map[string]bool) ([]*jwk, error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("not a JSON Web Key Set: %v", err)
	}
	var keys []*jwk
	var skipped []string
	for i, raw := range set.Keys {
		k, err := parseJWK(raw, allowed)
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("key %d: %v", i, err))
			continue
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		if len(set.Keys) == 0 {
			return nil, errors.New("no key in the set (want {\"keys\": [...]})")
		}
		return nil, fmt.Errorf("no usable key (%s)", strings.Join(skipped, "; "))
	}
	return keys, nil
}

// parseJWK parses one key of a JWKS, or says why it is not usable.
func parseJWK(raw json.RawMessage, allowed map[string]bool) (*jwk, error) {
	var j jwkJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, fmt.Errorf("malformed: %v", err)
	}
	if j.Use != "" && j.Use != "sig" {
		return nil, fmt.Errorf("use %q, not sig", j.Use)
	}
	if j.KeyOps != nil && !slices.Contains(j.KeyOps, "verify") {
		return nil, errors.New("key_ops without verify")
	}
	k := &jwk{kid: j.Kid, alg: j.Alg, kty: j.Kty}
	switch j.Kty {
	case "RSA":
		n, err1 := jwkBytes(j.N)
		e, err2 := jwkBytes(j.E)
		if err1 != nil || err2 != nil || len(n) == 0 || len(e) == 0 {
			return nil, errors.New("RSA key without valid n and e")
		}
		pub := &rsa.PublicKey{N: new(big.Int).SetBytes(n)}
		if len(e) > 4 || new(big.Int).SetBytes(e).Int64() > math.MaxInt32 {
			return nil, errors.New("RSA exponent too large")
		}
		pub.E = int(new(big.Int).SetBytes(e).Int64())
		if pub.E < 3 || pub.E%2 == 0 {
			return nil, errors.New("RSA exponent invalid")
		}
		if bits := pub.N.BitLen(); bits < jwtMinRSABits || bits > jwtMaxRSABits {
			return nil, fmt.Errorf("RSA modulus of %d bits; want %d to %d", bits, jwtMinRSABits, jwtMaxRSABits)
		}
		k.key = pub
	case "EC":
		var curve elliptic.Curve
		switch j.Crv {
		case "P-256":
			curve = elliptic.P256()
		case "P-384":
			curve = elliptic.P384()
		case "P-521":
			curve = elliptic.P521()
		default:
			return nil, fmt.Errorf("EC curve %q (known: P-256, P-384, P-521)", j.Crv)
		}
		size := (curve.Params().BitSize + 7) / 8
		x, err1 := jwkBytes(j.X)
		y, err2 := jwkBytes(j.Y)
		if err1 != nil || err2 != nil || len(x) != size || len(y) != size {
			return nil, fmt.Errorf("EC key without x and y of %d bytes", size)
		}
		pub, err := ecdsa.ParseUncompressedPublicKey(curve, append(append([]byte{4}, x...), y...))
		if err != nil {
			return nil, errors.New("EC point not on its curve")
		}
		k.crv, k.key = j.Crv, pub
	case "OKP":
		if j.Crv != "Ed25519" {
			return nil, fmt.Errorf("OKP curve %q (known: Ed25519)", j.Crv)
		}
		x, err := jwkBytes(j.X)
		if err != nil || len(x) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("Ed25519 key without x of %d bytes", ed25519.PublicKeySize)
		}
		k.crv, k.key = j.Crv, ed25519.PublicKey(x)
	default:
		return nil, fmt.Errorf("key type %q (known: RSA, EC, OKP)", j.Kty)
	}
	if k.alg != "" {
		alg, ok := jwtAlgs[k.alg]
		switch {
		case !ok || !k.fits(k.alg, alg):
			return nil, fmt.Errorf("alg %q does not fit a %s key", k.alg, k.kty)
		case !allowed[k.alg]:
			return nil, fmt.Errorf("alg %s not among the algorithms", k.alg)
		}
		return k, nil
	}
	for name, alg := range jwtAlgs {
		if allowed[name] && k.fits(name, alg) {
			return k, nil
		}
	}
	return nil, fmt.Errorf("no algorithm among the algorithms fits a %s key", strings.TrimSpace(k.kty+" "+k.crv))
}

// jwkBytes decodes a base64url member of a JWK (trailing padding tolerated).
func jwkBytes(s string) ([]byte, error) {
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
}

// errNoToken is the error of Principal for a request without a bearer token.
var errNoToken = errors.New("no bearer token")

// The reasons Principal refuses a token: words safe to send to the client.
var (
	errJWTAuthHeaders = errors.New("several Authorization headers")
	errJWTTooLong     = errors.New("bearer token too long")
	errJWTMalformed   = errors.New("token is not a compact JWS (three base64url parts without padding)")
	errJWTHeader      = errors.New("token header is not a JSON object with an alg")
	errJWTNone        = errors.New("unsigned token (alg none) refused")
	errJWTAlg         = errors.New("token alg not accepted")
	errJWTCrit        = errors.New("token header with crit refused")
	errJWTUnknownKid  = errors.New("token kid names no known key")
	errJWTKidAlg      = errors.New("the key the token's kid names does not fit its alg")
	errJWTNoKey       = errors.New("no key for the token's alg")
	errJWTNeedKid     = errors.New("token without kid, and several keys fit its alg")
	errJWTSignature   = errors.New("token signature invalid")
	errJWTPayload     = errors.New("token payload is not a JSON object")
	errJWTNoExp       = errors.New("token without exp")
	errJWTExpired     = errors.New("token expired")
	errJWTNotYet      = errors.New("token not valid yet (nbf)")
	errJWTFuture      = errors.New("token issued in the future (iat)")
	errJWTIssuer      = errors.New("token iss does not match")
	errJWTAudience    = errors.New("token aud does not match")
)

// jwtVerifier verifies bearer tokens for one jwt scope. It is safe for
// concurrent use; build it with newJWTVerifier and stop it with Close.
type jwtVerifier struct {
	claim    string
	issuer   string
	audience string
	leeway   time.Duration
	allowed  map[string]bool // the alg values accepted
	secret   []byte          // the HMAC secret; nil with a JWKS

	// now is the clock of exp, nbf, iat and of the rate of refetches for an
	// unknown kid; time.Now unless a test sets it (before any use).
	now func() time.Time

	keys atomic.Pointer[[]*jwk] // the current JWKS (jwks_file or jwks_url)

	// jwks_url: the client, the refresher and the fetches, one at a time.
	url          string
	client       *http.Client
	refresh      time.Duration
	fetchMu      sync.Mutex // held by each fetch; orders lastKidFetch
	lastKidFetch time.Time  // when an unknown kid last caused a fetch (under fetchMu)
	ctx          context.Context
	cancel       context.CancelFunc
	done         chan struct{} // closed when the refresher returns
	closeOnce    sync.Once

	// onRefreshError, when set, is called with each failed fetch of
	// jwks_url after the first (the set in use stays the old one). Set it
	// with OnRefreshError, safe while the refresher runs.
	onRefreshError func(error)
	hookMu         sync.Mutex // guards onRefreshError
}

// jwtOptions are the seams of tests: the clock, the ticks of the refresher
// (nil: a time.Ticker of jwks_refresh), and a function told the result of
// each of the refresher's fetches.
type jwtOptions struct {
	now       func() time.Time
	tick      <-chan time.Time
	refreshed func(error)
}

// newJWTVerifier builds a verifier from a checked JWTScope: it checks c
// again (an error lists checkJWT's problems), reads the secret or the JWKS
// file, and for jwks_url fetches the set once under ctx (an error if it
// cannot: the gateway's start retries or reports it) and starts a refresher
// goroutine, which fetches it every jwks_refresh until Close; a failed
// refresh keeps the set in use. ctx bounds that first fetch only. client is
// the http.Client for jwks_url; nil is a client with a 10 s timeout that
// follows redirects only to URLs jwks_url itself could name.
func newJWTVerifier(ctx context.Context, c *JWTScope, client *http.Client) (*jwtVerifier, error) {
	return newJWTVerifierOptions(ctx, c, client, jwtOptions{})
}

// newJWTVerifierOptions is newJWTVerifier with the seams of tests.
func newJWTVerifierOptions(ctx context.Context, c *JWTScope, client *http.Client, o jwtOptions) (*jwtVerifier, error) {
	if c == nil {
		return nil, errors.New("jwt: no configuration")
	}
	if ps := checkJWT(c); len(ps) > 0 {
		msgs := make([]string, len(ps))
		for i, p := range ps {
			msgs[i] = p.String()
		}
		return nil, fmt.Errorf("jwt: %s", strings.Join(msgs, "; "))
	}
	if o.now == nil {
		o.now = time.Now
	}
	v := &jwtVerifier{
		claim:    c.Claim,
		issuer:   c.Issuer,
		audience: c.Audience,
		leeway:   c.Leeway,
		now:      o.now,
		done:     make(chan struct{}),
	}
	switch {
	case c.HMACSecretFile != "" || c.HMACSecretEnv != "":
		secret, err := jwtSecret(c)
		if err != nil {
			return nil, fmt.Errorf("jwt: %v", err)
		}
		v.secret = secret
		v.allowed = jwtAllowed(c, len(secret))
	case c.JWKSFile != "":
		v.allowed = jwtAllowed(c, 0)
		b, err := readJWKSFile(c.JWKSFile)
		if err != nil {
			return nil, fmt.Errorf("jwt: %v", err)
		}
		keys, err := parseJWKS(b, v.allowed)
		if err != nil {
			return nil, fmt.Errorf("jwt: %s: %v", c.JWKSFile, err)
		}
		v.keys.Store(&keys)
	default:
		v.allowed = jwtAllowed(c, 0)
		v.url = c.JWKSURL
		v.refresh = c.JWKSRefresh
		v.client = client
		if v.client == nil {
			v.client = &http.Client{
				Timeout: jwtFetchTimeout,
				CheckRedirect: func(req *http.Request, via []*http.Request) error {
					if len(via) >= 5 {
						return errors.New("stopped after 5 redirects")
					}
					return checkJWKSURL(req.URL.String())
				},
			}
		}
		if err := v.fetch(ctx); err != nil {
			return nil, fmt.Errorf("jwt: %v", err)
		}
		v.ctx, v.cancel = context.WithCancel(context.WithoutCancel(ctx))
		tick := o.tick
		var ticker *time.Ticker
		if tick == nil {
			ticker = time.NewTicker(v.refresh)
			tick = ticker.C
		}
		go v.refresher(tick, ticker, o.refreshed)
		return v, nil
	}
	close(v.done)
	return v, nil
}

// OnRefreshError sets the function called with each failed fetch of
// jwks_url after the first (a refresh, or a refetch for an unknown kid);
// the verifier keeps the set it has. Safe while the refresher runs; nil
// stops the reports.
func (v *jwtVerifier) OnRefreshError(f func(error)) {
	v.hookMu.Lock()
	v.onRefreshError = f
	v.hookMu.Unlock()
}

// refreshFailed reports err to onRefreshError, if set.
func (v *jwtVerifier) refreshFailed(err error) {
	v.hookMu.Lock()
	f := v.onRefreshError
	v.hookMu.Unlock()
	if f != nil {
		f(err)
	}
}

// refresher fetches jwks_url at each tick until Close, telling refreshed,
// when not nil, the result of each fetch.
func (v *jwtVerifier) refresher(tick <-chan time.Time, ticker *time.Ticker, refreshed func(error)) {
	defer close(v.done)
	if ticker != nil {
		defer ticker.Stop()
	}
	for {
		select {
		case <-v.ctx.Done():
			return
		case <-tick:
			err := v.fetch(v.ctx)
			if err != nil && v.ctx.Err() == nil {
				v.refreshFailed(err)
			}
			if refreshed != nil {
				refreshed(err)
			}
		}
	}
}

// fetch gets jwks_url and, when it holds a usable key, makes it the set in
// use; on any error the set in use stays.
func (v *jwtVerifier) fetch(ctx context.Context) error {
	v.fetchMu.Lock()
	defer v.fetchMu.Unlock()
	return v.fetchLocked(ctx)
}

// fetchLocked is fetch with fetchMu held.
func (v *jwtVerifier) fetchLocked(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.url, nil)
	if err != nil {
		return fmt.Errorf("jwks_url: %v", err)
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	resp, err := v.client.Do(req)
	if err != nil {
		return fmt.Errorf("jwks_url: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("jwks_url %s: status %s", v.url, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, jwtMaxJWKS+1))
	if err != nil {
		return fmt.Errorf("jwks_url %s: %v", v.url, err)
	}
	if len(b) > jwtMaxJWKS {
		return fmt.Errorf("jwks_url %s: larger than %d bytes", v.url, jwtMaxJWKS)
	}
	keys, err := parseJWKS(b, v.allowed)
	if err != nil {
		return fmt.Errorf("jwks_url %s: %v", v.url, err)
	}
	v.keys.Store(&keys)
	return nil
}

// Close stops the refresher of jwks_url and waits for it to return; a
// verifier without one has nothing to stop. Principal still works after
// Close, with the last set and without fetching. Close may be called more
// than once.
func (v *jwtVerifier) Close() {
	v.closeOnce.Do(func() {
		if v.cancel != nil {
			v.cancel()
		}
	})
	<-v.done
}

// jwtHeader is the protected header of a JWS, the members the gateway reads.
type jwtHeader struct {
	Alg  string          `json:"alg"`
	Kid  string          `json:"kid"`
	Crit json.RawMessage `json:"crit"`
}

// Principal verifies r's bearer token (Authorization: Bearer <token>, the
// scheme case-insensitive) and returns the principal: the string claim of
// the scope's claim. The error says why the token was refused, in words safe
// to send to the client (never the token, never a claim's value);
// errors.Is(err, errNoToken) when there is no bearer token (no Authorization
// header, another scheme, or an empty token).
//
// A token is accepted when it is a compact JWS (three base64url parts, no
// padding) whose header names an accepted alg (never none; HS* only with an
// HMAC secret) and no crit, whose signature verifies with the secret or with
// the key of the JWKS its kid names (without kid: the only key that fits
// the alg), and whose claims hold an exp not past, an nbf and an iat not in
// the future (each with the leeway), the issuer and audience when
// configured, and the claim as a non-empty string of at most 255 bytes.
// A kid not in a jwks_url set fetches the set again, at most once a minute.
func (v *jwtVerifier) Principal(r *http.Request) (string, error) {
	token, err := bearerToken(r)
	if err != nil {
		return "", err
	}
	claims, err := v.verify(token)
	if err != nil {
		return "", err
	}
	return v.principal(claims)
}

// bearerToken returns the token of r's Authorization: Bearer header.
func bearerToken(r *http.Request) (string, error) {
	hs := r.Header.Values("Authorization")
	switch len(hs) {
	case 0:
		return "", errNoToken
	case 1:
	default:
		return "", errJWTAuthHeaders
	}
	scheme, token, _ := strings.Cut(strings.TrimSpace(hs[0]), " ")
	token = strings.TrimSpace(token)
	if !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", errNoToken
	}
	if len(token) > jwtMaxToken {
		return "", errJWTTooLong
	}
	return token, nil
}

// verify checks token's form, alg and signature, and returns its claims.
func (v *jwtVerifier) verify(token string) (map[string]any, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, errJWTMalformed
	}
	enc := base64.RawURLEncoding.Strict()
	hb, err1 := enc.DecodeString(parts[0])
	payload, err2 := enc.DecodeString(parts[1])
	sig, err3 := enc.DecodeString(parts[2])
	if err1 != nil || err2 != nil || err3 != nil {
		return nil, errJWTMalformed
	}
	var h jwtHeader
	if err := json.Unmarshal(hb, &h); err != nil || h.Alg == "" {
		return nil, errJWTHeader
	}
	if strings.EqualFold(h.Alg, "none") {
		return nil, errJWTNone
	}
	alg, ok := jwtAlgs[h.Alg]
	if !ok || !v.allowed[h.Alg] {
		return nil, errJWTAlg
	}
	if h.Crit != nil {
		return nil, errJWTCrit
	}
	signed := []byte(token[:len(parts[0])+1+len(parts[1])])
	if alg.kty == "oct" {
		if v.secret == nil { // allowed holds no HS* without a secret; kept for safety
			return nil, errJWTAlg
		}
		mac := hmac.New(alg.hash.New, v.secret)
		mac.Write(signed)
		if !hmac.Equal(mac.Sum(nil), sig) {
			return nil, errJWTSignature
		}
	} else {
		k, err := v.key(h.Kid, h.Alg, alg)
		if err != nil {
			return nil, err
		}
		if !verifySignature(k, alg, signed, sig) {
			return nil, errJWTSignature
		}
	}
	var claims map[string]any
	d := json.NewDecoder(strings.NewReader(string(payload)))
	d.UseNumber()
	if err := d.Decode(&claims); err != nil || claims == nil || d.More() {
		return nil, errJWTPayload
	}
	return claims, nil
}

// key chooses the key of the set that verifies a token with kid and alg:
// the key kid names, or without kid the only key that fits alg. An unknown
// kid fetches jwks_url again, at most once every jwtKidRefetch, under the
// verifier's context (Close cancels it), not the request's: a client that
// leaves does not waste the minute's fetch.
func (v *jwtVerifier) key(kid, name string, alg jwtAlg) (*jwk, error) {
	k, err := v.find(kid, name, alg)
	if err != errJWTUnknownKid || v.url == "" {
		return k, err
	}
	v.fetchMu.Lock()
	defer v.fetchMu.Unlock()
	// Another request may have fetched the set while this one waited.
	if k, err := v.find(kid, name, alg); err != errJWTUnknownKid {
		return k, err
	}
	now := v.now()
	if !v.lastKidFetch.IsZero() && now.Sub(v.lastKidFetch) < jwtKidRefetch {
		return nil, errJWTUnknownKid
	}
	v.lastKidFetch = now
	if err := v.fetchLocked(v.ctx); err != nil {
		if v.ctx.Err() == nil {
			v.refreshFailed(err)
		}
		return nil, errJWTUnknownKid
	}
	return v.find(kid, name, alg)
}

// find looks kid, or without kid the only key that fits alg, up in the set
// in use.
func (v *jwtVerifier) find(kid, name string, alg jwtAlg) (*jwk, error) {
	p := v.keys.Load()
	if p == nil {
		return nil, errJWTNoKey
	}
	keys := *p
	if kid != "" {
		named := false
		for _, k := range keys {
			if k.kid != kid {
				continue
			}
			named = true
			if k.fits(name, alg) {
				return k, nil
			}
		}
		if named {
			return nil, errJWTKidAlg
		}
		return nil, errJWTUnknownKid
	}
	var found *jwk
	for _, k := range keys {
		if k.fits(name, alg) {
			if found != nil {
				return nil, errJWTNeedKid
			}
			found = k
		}
	}
	if found == nil {
		return nil, errJWTNoKey
	}
	return found, nil
}

// verifySignature verifies sig over signed with the public key k, which fits alg.
func verifySignature(k *jwk, alg jwtAlg, signed, sig []byte) bool {
	if alg.kty == "OKP" {
		pub, ok := k.key.(ed25519.PublicKey)
		return ok && len(sig) == ed25519.SignatureSize && ed25519.Verify(pub, signed, sig)
	}
	h := alg.hash.New()
	h.Write(signed)
	digest := h.Sum(nil)
	switch pub := k.key.(type) {
	case *rsa.PublicKey:
		if alg.pss {
			return rsa.VerifyPSS(pub, alg.hash, digest, sig, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash}) == nil
		}
		return rsa.VerifyPKCS1v15(pub, alg.hash, digest, sig) == nil
	case *ecdsa.PublicKey:
		size := (pub.Curve.Params().BitSize + 7) / 8
		if len(sig) != 2*size {
			return false
		}
		r := new(big.Int).SetBytes(sig[:size])
		s := new(big.Int).SetBytes(sig[size:])
		return ecdsa.Verify(pub, digest, r, s)
	}
	return false
}

// principal checks the time claims, iss and aud, and returns the claim
// that names the principal.
func (v *jwtVerifier) principal(claims map[string]any) (string, error) {
	now := v.now()
	exp, ok, err := numericDate(claims, "exp")
	switch {
	case err != nil:
		return "", err
	case !ok:
		return "", errJWTNoExp
	case !now.Before(exp.Add(v.leeway)):
		return "", errJWTExpired
	}
	if nbf, ok, err := numericDate(claims, "nbf"); err != nil {
		return "", err
	} else if ok && now.Add(v.leeway).Before(nbf) {
		return "", errJWTNotYet
	}
	if iat, ok, err := numericDate(claims, "iat"); err != nil {
		return "", err
	} else if ok && now.Add(v.leeway).Before(iat) {
		return "", errJWTFuture
	}
	if v.issuer != "" {
		if iss, ok := claims["iss"].(string); !ok || iss != v.issuer {
			return "", errJWTIssuer
		}
	}
	if v.audience != "" && !hasAudience(claims["aud"], v.audience) {
		return "", errJWTAudience
	}
	switch p, ok := claims[v.claim].(string); {
	case claims[v.claim] == nil:
		return "", fmt.Errorf("token without the claim %s", v.claim)
	case !ok:
		return "", fmt.Errorf("token claim %s is not a string", v.claim)
	case p == "":
		return "", fmt.Errorf("token claim %s is empty", v.claim)
	case len(p) > jwtMaxPrincipal:
		return "", fmt.Errorf("token claim %s is longer than %d bytes", v.claim, jwtMaxPrincipal)
	default:
		return p, nil
	}
}

// numericDate returns the NumericDate claim name (seconds since the epoch,
// fractions allowed), whether the claims hold it, and an error when it is
// not a number.
func numericDate(claims map[string]any, name string) (time.Time, bool, error) {
	c, ok := claims[name]
	if !ok {
		return time.Time{}, false, nil
	}
	n, ok := c.(json.Number)
	if !ok {
		return time.Time{}, false, fmt.Errorf("token %s is not a number", name)
	}
	f, err := n.Float64()
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return time.Time{}, false, fmt.Errorf("token %s is not a number", name)
	}
	// Clamp to years 0 to 9999 or so, far beyond any clock, to stay in int64 nanoseconds.
	const limit = 1 << 37
	f = max(-limit, min(limit, f))
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)), true, nil
}

// hasAudience reports whether aud, a string or an array of strings, holds want.
func hasAudience(aud any, want string) bool {
	switch a := aud.(type) {
	case string:
		return a == want
	case []any:
		for _, x := range a {
			if s, ok := x.(string); ok && s == want {
				return true
			}
		}
	}
	return false
}
