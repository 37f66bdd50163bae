package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The jwt scope, through the binary: the principal is the token's sub, so
// a client whose token was refreshed between two attempts gets its replay,
// another principal's same key is its own operation, and a protected
// request without a valid token gets 401 with WWW-Authenticate; once with
// an HMAC secret file, once with a JWKS URL.
func TestProcessJWTScope(t *testing.T) {
	secret := []byte(strings.Repeat("s", 32))
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	jwks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(jwksJSON(jwkOf(ec, map[string]any{"kid": "k1"})))
	}))
	defer jwks.Close()
	for _, c := range []struct {
		name, config string
		sign         func(claims map[string]any) string
	}{
		{"hmac secret", fmt.Sprintf("{hmac_secret_file: %q, issuer: idp}", writeJWTFile(t, "secret", secret)),
			func(claims map[string]any) string { return signJWT(t, "HS256", secret, nil, claims) }},
		{"jwks url", fmt.Sprintf("{jwks_url: %q, issuer: idp}", jwks.URL),
			func(claims map[string]any) string {
				return signJWT(t, "ES256", ec, map[string]any{"kid": "k1"}, claims)
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := newUpstream(t)
			gw := startGateway(t, fmt.Sprintf(`listen: [{address: "127.0.0.1:0"}]
store: {memory: {}}
upstreams: {app: {url: %q}}
routes: [{match: "/", upstream: app, scope: {jwt: %s}}]
`, up.URL, c.config))
			ctx := deadline(t, time.Minute)
			hc := &http.Client{}
			token := func(sub string, iat int64) string {
				return "Bearer " + c.sign(map[string]any{"sub": sub, "iss": "idp", "iat": iat, "exp": time.Now().Add(time.Hour).Unix()})
			}
			now := time.Now().Unix()
			first := post(ctx, hc, gw.url("/orders"), "j1", `{}`, "Authorization", token("alice", now-10))
			again := settled(ctx, hc, gw.url("/orders"), "j1", `{}`, "Authorization", token("alice", now)) // refreshed
			if first.status != http.StatusCreated || !again.replayed || again.body != first.body {
				t.Fatalf("alice, then alice with a refreshed token: %v then %v", first, again)
			}
			if b := post(ctx, hc, gw.url("/orders"), "j1", `{}`, "Authorization", token("bob", now)); b.status != http.StatusCreated || b.replayed {
				t.Fatalf("bob's j1: %v, want his own execution", b)
			}
			if up.ran("j1") != 2 {
				t.Fatalf("the upstream ran j1 %d times, want 2 (alice, bob)", up.ran("j1"))
			}
			for _, bad := range []struct{ auth, challenge string }{
				{"", "Bearer"},
				{"Bearer " + c.sign(map[string]any{"sub": "eve", "iss": "other", "exp": time.Now().Add(time.Hour).Unix()}), `Bearer error="invalid_token"`},
				{"Bearer " + c.sign(map[string]any{"sub": "eve", "iss": "idp", "exp": time.Now().Add(-time.Hour).Unix()}), `Bearer error="invalid_token", error_description="token expired"`},
				{token("eve", now)[:40] + "x" + token("eve", now)[41:], `Bearer error="invalid_token"`},
			} {
				var h []string
				if bad.auth != "" {
					h = []string{"Authorization", bad.auth}
				}
				a := post(ctx, hc, gw.url("/orders"), "j2", `{}`, h...)
				if a.status != http.StatusUnauthorized || !strings.HasPrefix(a.header.Get("WWW-Authenticate"), bad.challenge) ||
					strings.Contains(a.body, "eve") {
					t.Errorf("Authorization %.30q...: %v, WWW-Authenticate %q; want 401 with %q", bad.auth, a, a.header.Get("WWW-Authenticate"), bad.challenge)
				}
			}
			if up.ran("j2") != 0 {
				t.Fatalf("a refused token reached the upstream")
			}
			// Not protected: passes through without a token.
			res, err := hc.Get(gw.url("/orders"))
			if err != nil || res.StatusCode != http.StatusCreated {
				t.Fatalf("GET without a token: %v %v", res, err)
			}
			res.Body.Close()
		})
	}
}
