package main

import (
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// An empty value (nothing after the colon, ~ or null) of a field that has
// a default is that default, exactly as when the field is left out: never
// "off" or zero. protect: with no value protects POST and PATCH, an
// upstream's timeout: with no value is 60s.
func TestConfigEmptyValueIsDefault(t *testing.T) {
	t.Setenv("IDEM_TEST_HMAC", strings.Repeat("s", 32))
	for _, c := range []struct {
		name, file string
		check      func(t *testing.T, c *Config)
	}{
		{"route and upstream", `instances:
shutdown_grace: ~
log: {level: }
listen:
  - address: 127.0.0.1:8080
    read_header_timeout:
    idle_timeout: null
store:
  memory: {}
upstreams:
  app:
    url: http://127.0.0.1:9000
    timeout:
    dial_timeout:
    idle_conn_timeout:
    response_header_timeout:
    max_conns:
    max_idle_conns:
routes:
  - match: POST /orders
    upstream: app
    scope: {none: true}
    protect:
    lease:
    ttl: ~
    wait:
    max_request_body:
    max_response_body:
`, func(t *testing.T, c *Config) {
			if r := c.Routes[0]; !reflect.DeepEqual(r.Protect, []string{"POST", "PATCH"}) || r.Lease != 30*time.Second || r.TTL != 24*time.Hour {
				t.Errorf("protect %q, lease %v, ttl %v: want [POST PATCH], 30s, 24h", r.Protect, r.Lease, r.TTL)
			}
			if u := c.Upstreams["app"]; u.Timeout != time.Minute || u.MaxIdleConns != 100 {
				t.Errorf("upstream timeout %v, max_idle_conns %d: want 1m0s, 100", u.Timeout, u.MaxIdleConns)
			}
			if c.Instances != 1 || c.Shutdown != 30*time.Second || c.Log.Level != "info" || c.Listen[0].IdleTimeout != 2*time.Minute {
				t.Errorf("instances %d, shutdown_grace %v, log.level %q, idle_timeout %v", c.Instances, c.Shutdown, c.Log.Level, c.Listen[0].IdleTimeout)
			}
		}},
		{"redis", `listen: [{address: 127.0.0.1:8080}]
store:
  redis:
    addrs: ["127.0.0.1:6379"]
    client:
    db:
    prefix:
    timeout:
upstreams: {app: {url: http://127.0.0.1:9000}}
routes: [{match: /, upstream: app, scope: {none: true}}]
`, func(t *testing.T, c *Config) {
			if r := c.Store.Redis; r.Client != "rueidis" || r.Prefix != "idem:" || r.Timeout <= 0 {
				t.Errorf("redis client %q, prefix %q, timeout %v", r.Client, r.Prefix, r.Timeout)
			}
		}},
		{"postgres", `listen: [{address: 127.0.0.1:8080}]
store:
  postgres:
    dsn: postgres://idem@localhost/idem
    table:
    create_table:
    max_conns:
upstreams: {app: {url: http://127.0.0.1:9000}}
routes: [{match: /, upstream: app, scope: {none: true}}]
`, func(t *testing.T, c *Config) {
			if p := c.Store.Postgres; p.Table != "idem_keys" || !p.CreateTable {
				t.Errorf("postgres table %q, create_table %v", p.Table, p.CreateTable)
			}
		}},
		{"jwt", `listen: [{address: 127.0.0.1:8080}]
store: {memory: {}}
upstreams: {app: {url: http://127.0.0.1:9000}}
routes:
  - match: /
    upstream: app
    scope:
      jwt:
        hmac_secret_env: IDEM_TEST_HMAC
        claim:
        jwks_refresh:
        leeway:
`, func(t *testing.T, c *Config) {
			if j := c.Routes[0].Scope.JWT; j.Claim != "sub" || j.Leeway != 30*time.Second || j.JWKSRefresh != 5*time.Minute {
				t.Errorf("jwt claim %q, leeway %v, jwks_refresh %v", j.Claim, j.Leeway, j.JWKSRefresh)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseConfig("g.yaml", []byte(c.file))
			if err != nil {
				t.Fatalf("an empty value of a field with a default: %v", err)
			}
			c.check(t, got)
			// The same file without those fields: the very same configuration.
			lines := strings.SplitAfter(c.file, "\n")
			var kept []string
			for i, line := range lines {
				if emptyValue(line, lines[i+1:]) {
					continue
				}
				kept = append(kept, line)
			}
			src := strings.ReplaceAll(strings.Join(kept, ""), "log: {level: }\n", "")
			want, err := parseConfig("g.yaml", []byte(src))
			if err != nil {
				t.Fatalf("%v\n%s", err, src)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("empty values:\n%+v\nfields left out:\n%+v", got, want)
			}
		})
	}
}

// emptyValue reports whether line is a field with an empty value: "x: ~",
// "x: null", or "x:" followed by a line indented no deeper.
func emptyValue(line string, rest []string) bool {
	line = strings.TrimRight(line, "\n")
	if strings.HasSuffix(line, ": ~") || strings.HasSuffix(line, ": null") {
		return true
	}
	if !strings.HasSuffix(line, ":") {
		return false
	}
	indent := func(s string) int { return len(s) - len(strings.TrimLeft(s, " -")) }
	return len(rest) == 0 || rest[0] == "" || indent(rest[0]) <= indent(line)
}

// An empty value of a field without a default is an error at its line and
// column (an empty mapping is {}: its fields take their defaults, and
// what it requires is missing).
func TestConfigEmptyValueErrors(t *testing.T) {
	t.Setenv("IDEM_TEST_HMAC", strings.Repeat("s", 32))
	for _, c := range []struct {
		name, old, new, want string
	}{
		{"upstream", "    upstream: app", "    upstream:", `g.yaml:12:14: routes[0].upstream: no value: write one, or leave the field out`},
		{"require_key", "    scope: {none: true}\n", "    scope: {none: true}\n    require_key:\n", `g.yaml:14:17: routes[0].require_key: no value`},
		{"scope.none", "{none: true}", "{none: }", `g.yaml:13:19: routes[0].scope.none: no value`},
		{"fingerprint", "    scope: {none: true}\n", "    scope: {none: true}\n    fingerprint: ~\n", `g.yaml:14:18: routes[0].fingerprint: no value`},
		{"cacheable", "    scope: {none: true}\n", "    scope: {none: true}\n    cacheable:\n", `g.yaml:14:15: routes[0].cacheable: no value`},
		{"protect item", "    scope: {none: true}\n", "    scope: {none: true}\n    protect: [POST, ~]\n", `g.yaml:14:21: routes[0].protect[1]: no value`},
		{"jwt issuer", "{none: true}", "{jwt: {hmac_secret_env: IDEM_TEST_HMAC, issuer: }}", `g.yaml:13:60: routes[0].scope.jwt.issuer: no value`},
		{"jwt algorithms", "{none: true}", "{jwt: {hmac_secret_env: IDEM_TEST_HMAC, algorithms: null}}", `g.yaml:13:64: routes[0].scope.jwt.algorithms: no value`},
		{"address", "  - address: 127.0.0.1:8080\n", "  - address:\n", `g.yaml:2:13: listen[0].address: no value`},
		{"url", "    url: http://127.0.0.1:9000\n", "    url:\n", `g.yaml:9:9: upstreams.app.url: no value`},
		{"redis addrs", "memory: {}", "redis: {addrs: }", `g.yaml:6:18: store.redis.addrs: no value`},
		{"admin address", "  address: 127.0.0.1:9090", "  address:", `g.yaml:4:11: admin.address: no value`},
		{"empty route", "routes:\n", "routes:\n  -\n", `g.yaml:11:4: routes[0]: no value`},
		{"tls", "  - address: 127.0.0.1:8080\n", "  - address: 127.0.0.1:8080\n    tls:\n", `g.yaml:3:9: listen[0].tls: needs both cert and key`},
		{"scope", "    scope: {none: true}", "    scope:", `g.yaml:13:11: routes[0].scope: declare exactly one of header, authorization, jwt and none`},
		{"jwt", "{none: true}", "{jwt: }", `g.yaml:13:18: routes[0].scope.jwt: declare one key source`},
		{"an upstream", "  app:\n    url: http://127.0.0.1:9000\n", "  app:\n", `g.yaml:8:7: upstreams.app.url: required`},
		{"redis", "memory: {}", "redis:", `g.yaml:6:9: store.redis.addrs: declare at least one host:port`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(base, c.old) {
				t.Fatalf("the base has no %q", c.old)
			}
			src := strings.Replace(base, c.old, c.new, 1)
			_, err := parseConfig("g.yaml", []byte(src))
			if err == nil {
				t.Fatalf("no error for:\n%s", src)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got:\n%v\nwant it to hold %q\nfile:\n%s", err, c.want, src)
			}
		})
	}
	// An empty mapping whose fields all have defaults is valid: it is {}.
	for _, c := range []struct{ old, empty, braces string }{
		{"  memory: {}", "  memory:", "  memory: {}"},
		{"admin:\n  address: 127.0.0.1:9090\n", "admin:\n", "admin: {}\n"},
		{"    scope: {none: true}\n", "    scope: {none: true}\n    key:\n", "    scope: {none: true}\n    key: {}\n"},
		{"store:\n", "log: ~\nstore:\n", "log: {}\nstore:\n"},
	} {
		got, err := parseConfig("g.yaml", []byte(strings.Replace(base, c.old, c.empty, 1)))
		if err != nil {
			t.Errorf("%q: %v", c.empty, err)
			continue
		}
		want, err := parseConfig("g.yaml", []byte(strings.Replace(base, c.old, c.braces, 1)))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%q is not %q:\n%+v\n%+v", c.empty, c.braces, got, want)
		}
	}
}

// A file with nothing in it (empty, only comments, only ---) gets one
// error that says so, not the errors of every field it lacks.
func TestConfigNoConfiguration(t *testing.T) {
	for _, src := range []string{"", "\n", "# nothing yet\n", "---\n", "---\n...\n", "---\n---\n", "--- # a comment\n---\n\n"} {
		_, err := parseConfig("g.yaml", []byte(src))
		if err == nil || err.Error() != "g.yaml: the file holds no configuration" {
			t.Errorf("%q: got %v, want the one error %q", src, err, "g.yaml: the file holds no configuration")
		}
	}
	// Empty documents around the configuration are not more documents.
	if _, err := parseConfig("g.yaml", []byte("---\n"+base+"---\n")); err != nil {
		t.Errorf("a configuration between two ---: %v", err)
	}
	// A file that is not a mapping: that one error.
	for _, src := range []string{"hello\n", "- a\n- b\n", "--- 3\n"} {
		_, err := parseConfig("g.yaml", []byte(src))
		if err == nil || strings.Count(err.Error(), "\n") != 0 || !strings.Contains(err.Error(), "g.yaml:1:") ||
			!strings.Contains(err.Error(), "want a mapping of fields") {
			t.Errorf("%q: got %v, want one error: want a mapping of fields", src, err)
		}
	}
}

// `protect:` with no value protects POST and PATCH, as its default says:
// a key sent twice reaches the upstream once. (It switched protection off:
// -check said the file was valid, and the upstream ran twice.)
func TestProcessEmptyProtect(t *testing.T) {
	up := newUpstream(t)
	cfg := memoryConfig(up, "    protect:\n")
	file := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr strings.Builder
	if code := cli([]string{"-config", file, "-check"}, &stdout, &stderr); code != 0 {
		t.Fatalf("-check: exit %d: %s", code, stderr.String())
	}
	gw := startGateway(t, cfg)
	ctx := deadline(t, time.Minute)
	c := &http.Client{}
	first := post(ctx, c, gw.url("/orders"), "k1", `{}`)
	again := settled(ctx, c, gw.url("/orders"), "k1", `{}`)
	if first.status != http.StatusCreated || !again.replayed || up.ran("k1") != 1 {
		t.Fatalf("protect: with no value: %v then %v, the upstream ran %d times: want once, then a replay", first, again, up.ran("k1"))
	}
}
