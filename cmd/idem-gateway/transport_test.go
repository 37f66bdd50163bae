package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/redistest"
)

// An h2c upstream is spoken to in HTTP/2 without TLS, and a TLS listener
// serves HTTPS with the configured certificate.
func TestProcessH2CUpstreamAndTLS(t *testing.T) {
	var mu sync.Mutex
	protos := map[string]int{}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := &http.Server{Protocols: &p, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		protos[r.Proto]++
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "served over %s\n", r.Proto)
	})}
	go up.Serve(ln)
	t.Cleanup(func() { up.Close() })

	dir := t.TempDir()
	cert, key, pool := selfSigned(t, dir)
	gw := startGateway(t, fmt.Sprintf(`listen: [{address: "127.0.0.1:0", tls: {cert: %q, key: %q}}]
store: {memory: {}}
upstreams: {app: {url: "http://%s", h2c: true}}
routes: [{match: "/", upstream: app, scope: {none: true}}]
`, cert, key, ln.Addr()))
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "localhost"}}}
	ctx := deadline(t, time.Minute)
	url := "https://" + gw.addr + "/orders"
	first := post(ctx, c, url, "h2", `{}`)
	again := settled(ctx, c, url, "h2", `{}`)
	if first.status != http.StatusCreated || first.body != "served over HTTP/2.0\n" || !again.replayed || again.body != first.body {
		t.Fatalf("over TLS to an h2c upstream: %v then %v", first, again)
	}
	if protos["HTTP/2.0"] != 1 || len(protos) != 1 {
		t.Fatalf("the upstream saw %v, want one HTTP/2.0 request", protos)
	}
	if a := post(ctx, &http.Client{}, "http://"+gw.addr+"/orders", "h2", `{}`); a.err == nil && a.status < 400 {
		t.Fatalf("plain HTTP on the TLS listener: %v", a)
	}
}

// selfSigned writes a certificate for localhost and its key, and returns
// their files and a pool that trusts the certificate.
func selfSigned(t testing.TB, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
	parsed, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(parsed)
	return certFile, keyFile, pool
}

// On a Redis Cluster, with either client: one run per key, replays.
func TestProcessRedisCluster(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	up := newUpstream(t)
	ctx := deadline(t, time.Minute)
	for _, client := range []string{"rueidis", "go-redis"} {
		t.Run(client, func(t *testing.T) {
			gw := startGateway(t, fmt.Sprintf(`listen: [{address: "127.0.0.1:0"}]
store: {redis: {client: %s, cluster: true, addrs: ["%s"], prefix: "gw-%d:"}}
upstreams: {app: {url: %q}}
routes: [{match: "/", upstream: app, scope: {none: true}}]
`, client, strings.Join(addrs, `", "`), time.Now().UnixNano(), up.URL))
			c := &http.Client{}
			for i := range 10 {
				key := fmt.Sprintf("%s-%d", client, i)
				first := post(ctx, c, gw.url("/orders"), key, `{}`)
				again := settled(ctx, c, gw.url("/orders"), key, `{}`)
				if first.status != http.StatusCreated || !again.replayed || again.body != first.body || up.ran(key) != 1 {
					t.Fatalf("%s: %v then %v, ran %d", key, first, again, up.ran(key))
				}
			}
		})
	}
}

// Through Sentinel, with either client: the gateway finds the master the
// sentinel names, and its records are there.
func TestProcessRedisSentinel(t *testing.T) {
	master := redistest.Start(t)
	sentinel := redistest.Sentinel(t, "idem-gw", master)
	up := newUpstream(t)
	ctx := deadline(t, time.Minute)
	for _, client := range []string{"rueidis", "go-redis"} {
		t.Run(client, func(t *testing.T) {
			gw := startGateway(t, fmt.Sprintf(`listen: [{address: "127.0.0.1:0"}]
store: {redis: {client: %s, sentinel_master: idem-gw, addrs: [%q], prefix: "gw-sentinel-%s:"}}
upstreams: {app: {url: %q}}
routes: [{match: "/", upstream: app, scope: {none: true}}]
`, client, sentinel, client, up.URL))
			key := "sentinel-" + client
			first := post(ctx, &http.Client{}, gw.url("/orders"), key, `{}`)
			again := settled(ctx, &http.Client{}, gw.url("/orders"), key, `{}`)
			if first.status != http.StatusCreated || !again.replayed || again.body != first.body || up.ran(key) != 1 {
				t.Fatalf("%v then %v, ran %d", first, again, up.ran(key))
			}
		})
	}
}

// A Redis that requires a password: the gateway reads it from a file or
// an environment variable, with either client; a wrong one gets 503 and
// /readyz 503, never the upstream.
func TestProcessRedisPassword(t *testing.T) {
	rp := redistest.StartProc(t, "--requirepass", "s3cret pass")
	up := newUpstream(t)
	ctx := deadline(t, time.Minute)
	file := filepath.Join(t.TempDir(), "redis-password")
	os.WriteFile(file, []byte("s3cret pass\n"), 0o600)
	config := func(client, secret string) string {
		return fmt.Sprintf(`listen: [{address: "127.0.0.1:0"}]
admin: {address: "127.0.0.1:0"}
store: {redis: {client: %s, addrs: [%q], %s}}
upstreams: {app: {url: %q}}
routes: [{match: "/", upstream: app, scope: {none: true}}]
`, client, rp.Addr(), secret, up.URL)
	}
	for _, client := range []string{"rueidis", "go-redis"} {
		t.Run(client, func(t *testing.T) {
			for i, secret := range []string{fmt.Sprintf("password_file: %q", file), "password_env: IDEM_TEST_REDIS_PASSWORD"} {
				gw := startGateway(t, config(client, secret), "IDEM_TEST_REDIS_PASSWORD=s3cret pass")
				key := fmt.Sprintf("pw-%s-%d", client, i)
				first := post(ctx, &http.Client{}, gw.url("/orders"), key, `{}`)
				again := settled(ctx, &http.Client{}, gw.url("/orders"), key, `{}`)
				if first.status != http.StatusCreated || !again.replayed || up.ran(key) != 1 {
					t.Fatalf("%s: %v then %v", secret, first, again)
				}
			}
			if client == "go-redis" { // rueidis cannot start without its Redis: the gateway retries
				gw := startGateway(t, config(client, "password_env: IDEM_TEST_REDIS_PASSWORD"), "IDEM_TEST_REDIS_PASSWORD=wrong")
				if a := post(ctx, &http.Client{}, gw.url("/orders"), "pw-wrong", `{}`); a.status != http.StatusServiceUnavailable || up.ran("pw-wrong") != 0 {
					t.Fatalf("a wrong password: %v", a)
				}
				res, err := http.Get("http://" + gw.admin + "/readyz")
				if err != nil || res.StatusCode != http.StatusServiceUnavailable {
					t.Fatalf("/readyz with a wrong password: %v %v", res, err)
				}
				res.Body.Close()
			}
		})
	}
}

// A Redis over TLS (its certificate trusted through ca_file), with either
// client.
func TestProcessRedisTLS(t *testing.T) {
	cert, key, _ := selfSigned(t, t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsAddr := ln.Addr().String()
	ln.Close()
	_, tlsPort, _ := net.SplitHostPort(tlsAddr)
	redistest.StartProc(t, "--tls-port", tlsPort, "--tls-cert-file", cert, "--tls-key-file", key,
		"--tls-ca-cert-file", cert, "--tls-auth-clients", "no")
	up := newUpstream(t)
	ctx := deadline(t, time.Minute)
	for _, client := range []string{"rueidis", "go-redis"} {
		t.Run(client, func(t *testing.T) {
			gw := startGateway(t, fmt.Sprintf(`listen: [{address: "127.0.0.1:0"}]
store: {redis: {client: %s, addrs: [%q], tls: {ca_file: %q}}}
upstreams: {app: {url: %q}}
routes: [{match: "/", upstream: app, scope: {none: true}}]
`, client, tlsAddr, cert, up.URL))
			key := "tls-" + client
			first := post(ctx, &http.Client{}, gw.url("/orders"), key, `{}`)
			again := settled(ctx, &http.Client{}, gw.url("/orders"), key, `{}`)
			if first.status != http.StatusCreated || !again.replayed || up.ran(key) != 1 {
				t.Fatalf("%v then %v", first, again)
			}
		})
	}
}
