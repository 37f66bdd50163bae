package main

// The verifier of the jwt scope: a bearer token in compact JWS form, signed
// with an HMAC secret or with one of the public keys of a JSON Web Key Set,
// whose claim names the principal.
//
// github.com/golang-jwt/jwt/v5 parses the token, verifies its signature and
// its registered claims (exp required, nbf, iat, iss, aud, with the leeway);
// github.com/MicahParks/jwkset decodes the keys of a JWKS (jwks.go). What
// stays here is the gateway's policy, each rule explicit: the config checks,
// the algorithms accepted (never none, HS* only with a secret, the others
// only with a JWKS), the key sizes, crit refused, the bounds of the token and
// of the principal, and the refusals named in words safe to send to the
// client.

import (
	"bytes"
	"context"
	"crypto"
	_ "crypto/sha256" // golang-jwt hashes with crypto.Hash: SHA-256 must be linked in
	_ "crypto/sha512" // and SHA-384, SHA-512
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
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

// jwtAlg describes a JWS algorithm (RFC 7518 section 3, RFC 8037): which
// keys may verify it. golang-jwt verifies it, by the same name.
type jwtAlg struct {
	hash crypto.Hash // the digest (for HS*, the least size of the secret); 0 for EdDSA
	kty  string      // the JWK key type: "oct" (HMAC), "RSA", "EC" or "OKP"
	crv  string      // the curve of EC and OKP keys
}

// jwtAlgs are the algorithms the gateway knows, by their alg name.
var jwtAlgs = map[string]jwtAlg{
	"HS256": {hash: crypto.SHA256, kty: "oct"},
	"HS384": {hash: crypto.SHA384, kty: "oct"},
	"HS512": {hash: crypto.SHA512, kty: "oct"},
	"RS256": {hash: crypto.SHA256, kty: "RSA"},
	"RS384": {hash: crypto.SHA384, kty: "RSA"},
	"RS512": {hash: crypto.SHA512, kty: "RSA"},
	"PS256": {hash: crypto.SHA256, kty: "RSA"},
	"PS384": {hash: crypto.SHA384, kty: "RSA"},
	"PS512": {hash: crypto.SHA512, kty: "RSA"},
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
// holding at least one key usable with the algorithms (RSA of 2048 to 8192
// bits); a jwks_url that is an absolute https URL, or http to a loopback
// host (127.0.0.1, ::1, localhost); a non-empty claim; algorithms among
// HS256/384/512, RS256/384/512, PS256/384/512, ES256/384/512 and EdDSA (never
// none), each listed once, HS* with an HMAC secret only and the others with a
// JWKS only (no alg confusion: a public key is never an HMAC secret);
// jwks_refresh at least 10s; leeway between 0 and 5m.
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

// jwtAllowed returns the algorithms c accepts: those listed, or by default
// every one its key source allows (HS256, and HS384 and HS512 when the
// secret of secretLen bytes is as long as their digest, for an HMAC secret;
// the RSA, ECDSA and EdDSA ones for a JWKS). None is never among them.
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
	errJWTExpNaN      = errors.New("token exp is not a number")
	errJWTExpired     = errors.New("token expired")
	errJWTNbfNaN      = errors.New("token nbf is not a number")
	errJWTNotYet      = errors.New("token not valid yet (nbf)")
	errJWTIatNaN      = errors.New("token iat is not a number")
	errJWTFuture      = errors.New("token issued in the future (iat)")
	errJWTIssuer      = errors.New("token iss does not match")
	errJWTAudience    = errors.New("token aud does not match")
	errJWTInvalid     = errors.New("token invalid")
)

// jwtRefusals name the errors of golang-jwt's parser as the gateway's
// refusals, the first that matches winning: its errors wrap the keyfunc's
// and jwtClaims' (the gateway's own, told as they are), and join every
// failed claim, told in the order exp, nbf, iat, iss, aud.
var jwtRefusals = []struct{ cause, refusal error }{
	{errJWTHeader, errJWTHeader},
	{errJWTCrit, errJWTCrit},
	{errJWTUnknownKid, errJWTUnknownKid},
	{errJWTKidAlg, errJWTKidAlg},
	{errJWTNoKey, errJWTNoKey},
	{errJWTNeedKid, errJWTNeedKid},
	{errJWTAlg, errJWTAlg},
	{errJWTPayload, errJWTPayload},
	{jwt.ErrTokenSignatureInvalid, errJWTSignature},
	{errJWTExpNaN, errJWTExpNaN},
	{jwt.ErrTokenRequiredClaimMissing, errJWTNoExp}, // exp: the one claim required (iss and aud tell their own)
	{jwt.ErrTokenExpired, errJWTExpired},
	{errJWTNbfNaN, errJWTNbfNaN},
	{jwt.ErrTokenNotValidYet, errJWTNotYet},
	{errJWTIatNaN, errJWTIatNaN},
	{jwt.ErrTokenUsedBeforeIssued, errJWTFuture},
	{errJWTIssuer, errJWTIssuer},
	{jwt.ErrTokenInvalidIssuer, errJWTIssuer},
	{errJWTAudience, errJWTAudience},
	{jwt.ErrTokenInvalidAudience, errJWTAudience},
	{jwt.ErrTokenMalformed, errJWTMalformed},
}

// jwtVerifier verifies bearer tokens for one jwt scope. It is safe for
// concurrent use; build it with newJWTVerifier and stop it with Close.
type jwtVerifier struct {
	claim   string
	allowed map[string]bool // the alg values accepted
	secret  []byte          // the HMAC secret; nil with a JWKS
	parser  *jwt.Parser     // golang-jwt's, with the scope's algorithms, leeway, issuer and audience

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
	v := &jwtVerifier{claim: c.Claim, now: o.now, done: make(chan struct{})}
	if c.HMACSecretFile != "" || c.HMACSecretEnv != "" {
		secret, err := jwtSecret(c)
		if err != nil {
			return nil, fmt.Errorf("jwt: %v", err)
		}
		v.secret = secret
		v.allowed = jwtAllowed(c, len(secret))
	} else {
		v.allowed = jwtAllowed(c, 0)
	}
	var err error
	if v.parser, err = jwtParser(c, v.allowed, o.now); err != nil {
		return nil, err
	}
	switch {
	case v.secret != nil:
	case c.JWKSFile != "":
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
		if err := v.startFetching(ctx, c, client, o); err != nil {
			return nil, fmt.Errorf("jwt: %v", err)
		}
		return v, nil
	}
	close(v.done)
	return v, nil
}

// jwtParser is golang-jwt's parser of a scope: the algorithms allowed (a
// list, never nil: without WithValidMethods golang-jwt accepts any alg it
// knows, and a scope without algorithms is an error), strict base64url, exp
// required, iat checked, the leeway, and the issuer and audience when
// configured.
func jwtParser(c *JWTScope, allowed map[string]bool, now func() time.Time) (*jwt.Parser, error) {
	methods := []string{}
	for _, name := range jwtAlgNames {
		if allowed[name] {
			methods = append(methods, name)
		}
	}
	if len(methods) == 0 {
		return nil, errors.New("jwt: no algorithm accepted") // checkJWT makes it unreachable
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(methods),
		jwt.WithStrictDecoding(),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(c.Leeway),
		jwt.WithTimeFunc(now),
	}
	if c.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(c.Issuer))
	}
	if c.Audience != "" {
		opts = append(opts, jwt.WithAudience(c.Audience))
	}
	return jwt.NewParser(opts...), nil
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
	var claims jwtClaims
	t, err := v.parser.ParseWithClaims(token, &claims, v.keyfunc)
	if err != nil {
		return "", v.refusal(t, err)
	}
	return v.principal(claims.MapClaims)
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

// keyfunc gives golang-jwt the key that verifies t, whose alg its parser
// has already checked against the algorithms allowed: the HMAC secret for
// HS*, else the key of the JWKS that kid names, or without kid the only key
// that fits the alg. A header with crit is refused (RFC 7515 section 4.1.11:
// the gateway understands no extension; golang-jwt does not look).
func (v *jwtVerifier) keyfunc(t *jwt.Token) (any, error) {
	if _, ok := t.Header["crit"]; ok {
		return nil, errJWTCrit
	}
	kid, ok := t.Header["kid"].(string)
	if !ok && t.Header["kid"] != nil {
		return nil, errJWTHeader
	}
	name := t.Method.Alg()
	alg, known := jwtAlgs[name]
	switch {
	case !known || !v.allowed[name]: // golang-jwt's WithValidMethods refused it already
		return nil, errJWTAlg
	case alg.kty == "oct":
		if v.secret == nil { // allowed holds no HS* without a secret; kept for safety
			return nil, errJWTAlg
		}
		return v.secret, nil
	}
	k, err := v.key(kid, name, alg)
	if err != nil {
		return nil, err
	}
	return k.key, nil
}

// refusal names the error of golang-jwt's parser for the client: the form
// first, then the header's alg, then jwtRefusals.
func (v *jwtVerifier) refusal(t *jwt.Token, err error) error {
	var b64 base64.CorruptInputError
	if t == nil || errors.As(err, &b64) {
		return errJWTMalformed
	}
	alg, _ := t.Header["alg"].(string)
	switch {
	case t.Header == nil || alg == "":
		return errJWTHeader
	case strings.EqualFold(alg, "none"):
		return errJWTNone
	case !v.allowed[alg]:
		return errJWTAlg
	}
	for _, r := range jwtRefusals {
		if errors.Is(err, r.cause) {
			return r.refusal
		}
	}
	return errJWTInvalid
}

// jwtClaims is a token's payload as golang-jwt's validator reads it: a JSON
// object whose numbers stay json.Number, and whose registered claims, when
// malformed or missing where required, give the gateway's refusals.
type jwtClaims struct{ jwt.MapClaims }

// UnmarshalJSON reads the payload, which must be a JSON object. (A payload
// of null leaves MapClaims nil: the getters refuse it.)
func (c *jwtClaims) UnmarshalJSON(b []byte) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&c.MapClaims); err != nil || c.MapClaims == nil {
		return errJWTPayload
	}
	return nil
}

// GetExpirationTime returns exp; golang-jwt requires it.
func (c *jwtClaims) GetExpirationTime() (*jwt.NumericDate, error) { return c.date("exp", errJWTExpNaN) }

// GetNotBefore returns nbf, if any.
func (c *jwtClaims) GetNotBefore() (*jwt.NumericDate, error) { return c.date("nbf", errJWTNbfNaN) }

// GetIssuedAt returns iat, if any.
func (c *jwtClaims) GetIssuedAt() (*jwt.NumericDate, error) { return c.date("iat", errJWTIatNaN) }

// GetIssuer returns iss, read only with an issuer configured: one missing,
// empty or not a string does not match it.
func (c *jwtClaims) GetIssuer() (string, error) {
	if iss, err := c.MapClaims.GetIssuer(); err == nil && iss != "" {
		return iss, nil
	}
	return "", errJWTIssuer
}

// GetAudience returns aud, read only with an audience configured: one
// missing, empty, or neither a string nor an array of strings does not
// hold it.
func (c *jwtClaims) GetAudience() (jwt.ClaimStrings, error) {
	if aud, err := c.MapClaims.GetAudience(); err == nil && len(aud) > 0 && !(len(aud) == 1 && aud[0] == "") {
		return aud, nil
	}
	return nil, errJWTAudience
}

// date returns the NumericDate claim name (seconds since the epoch,
// fractions allowed), nil when the payload lacks it, or nan when it is not
// a number.
func (c *jwtClaims) date(name string, nan error) (*jwt.NumericDate, error) {
	if c.MapClaims == nil {
		return nil, errJWTPayload
	}
	x, ok := c.MapClaims[name]
	if !ok {
		return nil, nil
	}
	n, ok := x.(json.Number)
	if !ok {
		return nil, nan
	}
	f, err := n.Float64()
	if err != nil {
		return nil, nan
	}
	// Clamp to years 0 to 9999 or so, far beyond any clock, to stay in int64
	// nanoseconds: golang-jwt would convert an out-of-range float as it is,
	// and an nbf of 1e300 could turn into a date long past.
	const limit = 1 << 37
	f = max(-limit, min(limit, f))
	sec, frac := math.Modf(f)
	return jwt.NewNumericDate(time.Unix(int64(sec), int64(frac*1e9))), nil
}

// principal returns the claim of a verified token that names the principal.
func (v *jwtVerifier) principal(claims jwt.MapClaims) (string, error) {
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
