package main

// The JSON Web Key Sets of the jwt scope: jwks_file, read at start, and
// jwks_url, fetched at start, every jwks_refresh and for an unknown kid.
//
// github.com/MicahParks/jwkset decodes each key (RSA n and e, EC points on
// their curve, Ed25519, x5c matching its key) and fetches nothing itself (no
// x5u). The gateway's policy stays here, explicit: which keys are usable
// (use sig, key_ops with verify, RSA of 2048 to 8192 bits, EC P-256/384/521
// and Ed25519 only, an alg that fits and is accepted), a set without a usable
// key is an error that keeps the set in use, and the fetch: bounded size and
// time, redirects only where jwks_url could point, refetch for an unknown kid
// at most once a minute. jwkset's HTTP storage is not used: it fails a whole
// set for one malformed key, reads an unbounded body, and its unknown-kid
// refresh waits on a rate limiter in the request.

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/MicahParks/jwkset"
)

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

// parseJWKS parses a JSON Web Key Set and returns its keys usable for
// verifying a signature with one of the allowed algorithms. Keys whose use
// is enc, whose key_ops lack verify, of an unknown type or curve, malformed,
// RSA keys under 2048 or over 8192 bits, and keys whose alg is not allowed or
// does not fit their type are skipped; none left is an error that says why
// each was.
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

// parseJWK decodes one key of a JWKS with jwkset, public material only (an
// oct key is refused), and applies the gateway's rules; or says why the key
// is not usable.
func parseJWK(raw json.RawMessage, allowed map[string]bool) (*jwk, error) {
	// The zero validate options: jwkset checks use, key_ops and x5c, and
	// fetches no x5u.
	j, err := jwkset.NewJWKFromRawJSON(raw, jwkset.JWKMarshalOptions{}, jwkset.JWKValidateOptions{})
	if err != nil {
		return nil, err
	}
	m := j.Marshal()
	if m.USE != "" && m.USE != jwkset.UseSig {
		return nil, fmt.Errorf("use %q, not sig", m.USE)
	}
	if m.KEYOPS != nil && !slices.Contains(m.KEYOPS, jwkset.KeyOpsVerify) {
		return nil, errors.New("key_ops without verify")
	}
	k := &jwk{kid: m.KID, alg: string(m.ALG), kty: string(m.KTY), crv: string(m.CRV), key: j.Key()}
	switch pub := k.key.(type) {
	case *rsa.PublicKey:
		if bits := pub.N.BitLen(); bits < jwtMinRSABits || bits > jwtMaxRSABits {
			return nil, fmt.Errorf("RSA modulus of %d bits; want %d to %d", bits, jwtMinRSABits, jwtMaxRSABits)
		}
		if pub.E < 3 || pub.E%2 == 0 {
			return nil, errors.New("RSA exponent invalid")
		}
	case *ecdsa.PublicKey, ed25519.PublicKey:
		// jwkset decodes EC keys on P-256, P-384 and P-521 only, each point
		// on its curve, and OKP keys as Ed25519 of 32 bytes.
	default:
		return nil, fmt.Errorf("key type %q %q (known: RSA, EC, OKP Ed25519)", m.KTY, m.CRV)
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

// startFetching sets v up for c's jwks_url: the client, the first fetch
// under ctx, and the refresher.
func (v *jwtVerifier) startFetching(ctx context.Context, c *JWTScope, client *http.Client, o jwtOptions) error {
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
		return err
	}
	v.ctx, v.cancel = context.WithCancel(context.WithoutCancel(ctx))
	tick := o.tick
	var ticker *time.Ticker
	if tick == nil {
		ticker = time.NewTicker(v.refresh)
		tick = ticker.C
	}
	go v.refresher(tick, ticker, o.refreshed)
	return nil
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
