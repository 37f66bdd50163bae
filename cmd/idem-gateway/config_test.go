package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// base is a valid file; each case below changes one thing.
const base = `listen:
  - address: 127.0.0.1:8080
admin:
  address: 127.0.0.1:9090
store:
  memory: {}
upstreams:
  app:
    url: http://127.0.0.1:9000
routes:
  - match: POST /orders
    upstream: app
    scope: {none: true}
`

func TestConfigDefaults(t *testing.T) {
	c, err := parseConfig("g.yaml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Routes[0]
	if c.Instances != 1 || c.Shutdown != 30*time.Second || c.Log.Level != "info" || c.Listen[0].ReadHeaderTimeout != 10*time.Second ||
		r.Lease != 30*time.Second || r.TTL != 24*time.Hour || !reflect.DeepEqual(r.Protect, []string{"POST", "PATCH"}) ||
		r.MaxRequestBody != 1<<20 || r.MaxResponseBody != 1<<20 || c.Upstreams["app"].Timeout != time.Minute ||
		c.Upstreams["app"].MaxIdleConns != 100 {
		t.Fatalf("defaults not applied: %+v %+v %+v", c, r, c.Upstreams["app"])
	}
	red, err := parseConfig("g.yaml", []byte(strings.Replace(base, "memory: {}", "redis: {addrs: [\"127.0.0.1:6379\"]}", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if s := red.Store.Redis; s.Client != "rueidis" || s.Prefix != "idem:" || s.Timeout != 250*time.Millisecond {
		t.Fatalf("redis defaults: %+v", s)
	}
}

// Each invalid field gives its error, naming the file, the line and
// column, and the field.
func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o600)
	t.Setenv("IDEM_TEST_EMPTY", "")
	for _, c := range []struct {
		name, old, new, want string
	}{
		{"unknown field", "    scope: {none: true}\n", "    scope: {none: true}\n    leese: 3s\n", `g.yaml:14:5: routes[0].leese: unknown field (known: match, upstream, protect`},
		{"field twice", "    upstream: app\n", "    upstream: app\n    upstream: app\n", `g.yaml:13:5: routes[0].upstream: declared twice`},
		{"duration", "    scope: {none: true}\n", "    scope: {none: true}\n    lease: 3x\n", `g.yaml:14:12: routes[0].lease: "3x" is not a duration`},
		{"integer", "    scope: {none: true}\n", "    scope: {none: true}\n    max_request_body: 1MB\n", `g.yaml:14:23: routes[0].max_request_body: "1MB" is not an integer`},
		{"bool", "{none: true}", "{none: yes}", `g.yaml:13:19: routes[0].scope.none: "yes" is not true or false`},
		{"list", "    scope: {none: true}\n", "    scope: {none: true}\n    protect: POST\n", `g.yaml:14:14: routes[0].protect: want a list, got "POST"`},
		{"mapping", "store:\n  memory: {}", "store: memory", `g.yaml:5:8: store: want a mapping of fields, got "memory"`},
		{"syntax", "routes:\n", "routes: [\n", `g.yaml:10: not valid YAML: did not find expected node content`},
		{"no listener", "listen:\n  - address: 127.0.0.1:8080\n", "", `g.yaml:1:1: listen: declare at least one listener`},
		{"address", "127.0.0.1:8080", "8080", `g.yaml:2:14: listen[0].address: "8080": want host:port`},
		{"admin address", "127.0.0.1:9090", "localhost:http", `g.yaml:4:12: admin.address: "localhost:http": want host:port`},
		{"tls half", "  - address: 127.0.0.1:8080\n", "  - address: 127.0.0.1:8080\n    tls: {cert: a.pem}\n", `g.yaml:3:10: listen[0].tls: needs both cert and key`},
		{"tls files", "  - address: 127.0.0.1:8080\n", "  - address: 127.0.0.1:8080\n    tls: {cert: /nonexistent/a.pem, key: /nonexistent/a.key}\n", `g.yaml:3:10: listen[0].tls: cannot load the key pair`},
		{"timeout", "  - address: 127.0.0.1:8080\n", "  - address: 127.0.0.1:8080\n    idle_timeout: 0s\n", `g.yaml:3:19: listen[0].idle_timeout: must be positive`},
		{"grace", "store:\n", "shutdown_grace: -1s\nstore:\n", `g.yaml:5:17: shutdown_grace: must be positive`},
		{"log level", "store:\n", "log: {level: loud}\nstore:\n", `g.yaml:5:14: log.level: "loud": want debug, info, warn or error`},
		{"instances", "store:\n", "instances: 0\nstore:\n", `g.yaml:5:12: instances: must be at least 1`},
		{"two stores", "  memory: {}\n", "  memory: {}\n  redis: {addrs: [\"h:1\"]}\n", `g.yaml:6:3: store: declare exactly one of memory, redis, postgres and dynamodb (2 declared)`},
		{"no store", "store:\n  memory: {}\n", "", `g.yaml:1:1: store: declare exactly one of memory, redis, postgres and dynamodb (0 declared)`},
		{"memory shared", "store:\n", "instances: 3\nstore:\n", `g.yaml:7:11: store.memory: keeps the records in one process, and instances is 3`},
		{"memory bound", "memory: {}", "memory: {max_entries: -1}", `g.yaml:6:25: store.memory.max_entries: must not be negative`},
		{"redis client", "memory: {}", "redis: {client: jedis, addrs: [\"h:1\"]}", `g.yaml:6:19: store.redis.client: "jedis": want rueidis or go-redis`},
		{"redis addrs", "memory: {}", "redis: {client: rueidis}", `g.yaml:6:10: store.redis.addrs: declare at least one host:port`},
		{"redis addr", "memory: {}", "redis: {addrs: [\"redis\"]}", `g.yaml:6:19: store.redis.addrs[0]: "redis": want host:port`},
		{"redis single", "memory: {}", "redis: {addrs: [\"a:1\", \"b:1\"]}", `g.yaml:6:18: store.redis.addrs: a single server has one address`},
		{"redis modes", "memory: {}", "redis: {addrs: [\"a:1\"], cluster: true, sentinel_master: m}", `g.yaml:6:10: store.redis: cluster and sentinel_master exclude each other`},
		{"redis db", "memory: {}", "redis: {addrs: [\"a:1\"], cluster: true, db: 2}", `g.yaml:6:46: store.redis.db: must be 0 or more, and 0 with cluster`},
		{"redis secrets", "memory: {}", "redis: {addrs: [\"a:1\"], password_file: f, password_env: E}", `store.redis.password_env: exclusive with password_file`},
		{"redis password file", "memory: {}", "redis: {addrs: [\"a:1\"], password_file: /nonexistent/p}", `g.yaml:6:42: store.redis.password_file: open /nonexistent/p: no such file or directory`},
		{"redis empty password file", "memory: {}", "redis: {addrs: [\"a:1\"], password_file: " + empty + "}", `store.redis.password_file: ` + empty + ` is empty`},
		{"redis password env", "memory: {}", "redis: {addrs: [\"a:1\"], password_env: IDEM_TEST_EMPTY}", `store.redis.password_env: the environment variable IDEM_TEST_EMPTY is not set, or empty`},
		{"redis ca", "memory: {}", "redis: {addrs: [\"a:1\"], tls: {ca_file: " + empty + "}}", `store.redis.tls.ca_file: ` + empty + ` holds no PEM certificate`},
		{"redis prefix", "memory: {}", "redis: {addrs: [\"a:1\"], prefix: \"\"}", `store.redis.prefix: must not be empty`},
		{"redis timeout", "memory: {}", "redis: {addrs: [\"a:1\"], timeout: 0s}", `store.redis.timeout: must be positive`},
		{"postgres dsn", "memory: {}", "postgres: {dsn: a, dsn_env: B}", `g.yaml:6:13: store.postgres: declare exactly one of dsn, dsn_file and dsn_env`},
		{"postgres env", "memory: {}", "postgres: {dsn_env: IDEM_TEST_EMPTY}", `store.postgres.dsn_env: the environment variable IDEM_TEST_EMPTY is not set, or empty`},
		{"postgres table", "memory: {}", "postgres: {dsn: x, table: \"\"}", `store.postgres.table: must not be empty`},
		{"postgres timeout", "memory: {}", "postgres: {dsn: x, timeout: 0s}", `store.postgres.timeout: must be positive`},
		{"dynamodb and postgres", "  memory: {}\n", "  postgres: {dsn: x}\n  dynamodb: {table: orders_idem}\n", `store: declare exactly one of memory, redis, postgres and dynamodb (2 declared)`},
		{"dynamodb table", "memory: {}", "dynamodb: {region: eu-west-1}", `g.yaml:6:13: store.dynamodb.table: required: the table's name (or ARN)`},
		{"dynamodb table name", "memory: {}", "dynamodb: {table: \"orders idem\"}", `g.yaml:6:21: store.dynamodb.table: "orders idem": want 3 to 255 letters, digits, _, - and ., or a table's ARN`},
		{"dynamodb short table", "memory: {}", "dynamodb: {table: ab}", `store.dynamodb.table: "ab": want 3 to 255`},
		{"dynamodb region", "memory: {}", "dynamodb: {table: orders_idem, region: EU West}", `g.yaml:6:42: store.dynamodb.region: "EU West": want an AWS region such as eu-west-1`},
		{"dynamodb endpoint", "memory: {}", "dynamodb: {table: orders_idem, endpoint: \"localhost:8000\"}", `g.yaml:6:44: store.dynamodb.endpoint: "localhost:8000": want the URL of a DynamoDB API`},
		{"dynamodb endpoint scheme", "memory: {}", "dynamodb: {table: orders_idem, endpoint: \"ftp://h:1\"}", `store.dynamodb.endpoint: "ftp://h:1": want the URL`},
		{"dynamodb timeout", "memory: {}", "dynamodb: {table: orders_idem, timeout: 0s}", `store.dynamodb.timeout: must be positive`},
		{"dynamodb create_table", "memory: {}", "dynamodb: {table: orders_idem, create_table: yes}", `store.dynamodb.create_table: "yes" is not true or false`},
		{"dynamodb unknown field", "memory: {}", "dynamodb: {table: orders_idem, prefix: x}", `store.dynamodb.prefix: unknown field (known: table, region, endpoint, create_table, timeout)`},
		{"no upstream", "upstreams:\n  app:\n    url: http://127.0.0.1:9000\n", "", `upstreams: declare at least one upstream`},
		{"upstream url", "http://127.0.0.1:9000", "127.0.0.1:9000", `g.yaml:9:10: upstreams.app.url: "127.0.0.1:9000": want an absolute http:// or https:// URL`},
		{"upstream query", "http://127.0.0.1:9000", "http://127.0.0.1:9000/?a=1", `upstreams.app.url: "http://127.0.0.1:9000/?a=1": a base URL has no query, fragment or user`},
		{"h2c", "http://127.0.0.1:9000\n", "https://127.0.0.1:9000\n    h2c: true\n", `g.yaml:10:10: upstreams.app.h2c: h2c is HTTP/2 without TLS`},
		{"upstream timeout", "http://127.0.0.1:9000\n", "http://127.0.0.1:9000\n    timeout: -1s\n", `upstreams.app.timeout: must not be negative`},
		{"upstream conns", "http://127.0.0.1:9000\n", "http://127.0.0.1:9000\n    max_conns: -1\n", `upstreams.app.max_conns: must not be negative`},
		{"no route", "routes:\n  - match: POST /orders\n    upstream: app\n    scope: {none: true}\n", "routes: []\n", `routes: declare at least one route`},
		{"pattern", "POST /orders", "POST /orders/{id", `g.yaml:11:12: routes[0].match: parsing "POST /orders/{id"`},
		{"no pattern", "  - match: POST /orders\n", "  - protect: [POST]\n", `routes[0].match: required`},
		{"pattern twice", "    scope: {none: true}\n", "    scope: {none: true}\n  - match: POST /orders\n    upstream: app\n    scope: {none: true}\n", `g.yaml:14:12: routes[1].match: "POST /orders" is the pattern of routes[0] too (g.yaml:11:12)`},
		{"upstream name", "    upstream: app", "    upstream: ap", `g.yaml:12:15: routes[0].upstream: "ap" is not declared in upstreams (declared: app)`},
		{"method", "    scope: {none: true}\n", "    scope: {none: true}\n    protect: [post]\n", `g.yaml:14:15: routes[0].protect[0]: "post": want a method in upper case`},
		{"two keys", "    scope: {none: true}\n", "    scope: {none: true}\n    key: {header: X-Id, json: id}\n", `g.yaml:14:10: routes[0].key: declare one of header, json and form`},
		{"json path", "    scope: {none: true}\n", "    scope: {none: true}\n    key: {json: data..id}\n", `routes[0].key.json: "data..id": want member names joined by dots`},
		{"no scope", "    scope: {none: true}\n", "", `g.yaml:11:5: routes[0].scope: required`},
		{"two scopes", "{none: true}", "{none: true, header: X-User}", `g.yaml:13:12: routes[0].scope: declare exactly one of header, authorization, jwt and none`},
		{"jwt without keys", "{none: true}", "{jwt: {issuer: idp}}", `g.yaml:13:18: routes[0].scope.jwt: declare one key source: hmac_secret_file, hmac_secret_env, jwks_file or jwks_url`},
		{"jwt and header", "{none: true}", "{header: X-User, jwt: {hmac_secret_env: IDEM_TEST_EMPTY}}", `routes[0].scope: declare exactly one of header, authorization, jwt and none`},
		{"jwt url", "{none: true}", "{jwt: {jwks_url: \"http://idp.example.com/keys\"}}", `routes[0].scope.jwt.jwks_url: `},
		{"cacheable", "    scope: {none: true}\n", "    scope: {none: true}\n    cacheable: [\"2xx\"]\n", `g.yaml:14:17: routes[0].cacheable[0]: "2xx": want a status (201) or a range (200-299)`},
		{"body limit", "    scope: {none: true}\n", "    scope: {none: true}\n    max_response_body: 0\n", `routes[0].max_response_body: must be positive`},
		{"lease", "    scope: {none: true}\n", "    scope: {none: true}\n    lease: 1ms\n", `g.yaml:14:12: routes[0].lease: 1ms: must be at least 30ms`},
		{"ttl below lease", "    scope: {none: true}\n", "    scope: {none: true}\n    lease: 1m\n    ttl: 30s\n", `g.yaml:15:10: routes[0].ttl: 30s is shorter than the lease (1m0s)`},
		{"alias", "store:\n  memory: {}\n", "store:\n  memory: &m {}\nx: *m\n", `g.yaml:7:1: x: unknown field`},
		{"two documents", "", "---\nlisten: []\n", `g.yaml:14:1: more than one YAML document`},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := base
			if c.old != "" {
				if !strings.Contains(src, c.old) {
					t.Fatalf("the base has no %q", c.old)
				}
				src = strings.Replace(src, c.old, c.new, 1)
			} else {
				src += c.new
			}
			_, err := parseConfig("g.yaml", []byte(src))
			if err == nil {
				t.Fatalf("no error for:\n%s", src)
			}
			if !errors.Is(err, errConfig) {
				t.Errorf("errors.Is(err, errConfig) = false")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got:\n%v\nwant it to hold %q\nfile:\n%s", err, c.want, src)
			}
		})
	}
}

// docs/gateway.md holds the reference the Config type's tags make, and
// every field has its doc.
func TestReferenceInManual(t *testing.T) {
	checkDocs(t, reflect.TypeFor[Config]())
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "gateway.md"))
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- reference: begin (idem-gateway -reference) -->\n", "<!-- reference: end -->"
	_, rest, ok := strings.Cut(string(doc), begin)
	table, _, ok2 := strings.Cut(rest, end)
	if !ok || !ok2 {
		t.Fatalf("docs/gateway.md lacks the reference markers")
	}
	if table != configReference() {
		t.Fatalf("docs/gateway.md's reference differs from `idem-gateway -reference`: run\n\tgo run ./cmd/idem-gateway -reference\nand paste it between the markers")
	}
}

func checkDocs(t *testing.T, typ reflect.Type) {
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Tag.Get("doc") == "" || yamlName(f) == "" {
			t.Errorf("%s.%s has no yaml name or doc", typ.Name(), f.Name)
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice || ft.Kind() == reflect.Map {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			checkDocs(t, ft)
		}
	}
}

// The example files of the manual and the README load.
func TestExampleConfigs(t *testing.T) {
	files, _ := filepath.Glob("compose/*.yaml")
	files = append(files, "gateway.example.yaml")
	t.Setenv("IDEM_GATEWAY_PG_DSN", "postgres://idem@localhost/idem")
	for _, f := range files {
		if _, err := loadConfig(f); err != nil {
			t.Errorf("%v", err)
		}
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "gateway.md"))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("REDIS_PASSWORD", "secret")
	blocks := strings.Split(string(doc), "```yaml\n")[1:]
	if len(blocks) == 0 {
		t.Fatal("docs/gateway.md has no yaml block")
	}
	for i, b := range blocks {
		b, _, _ = strings.Cut(b, "```")
		if _, err := parseConfig(fmt.Sprintf("docs/gateway.md block %d", i+1), []byte(b)); err != nil {
			t.Errorf("%v", err)
		}
	}
}

// TestVersionFlag: -version prints the version and reads no file; the
// linked version (GoReleaser's, the Dockerfile's) wins over the module's.
func TestVersionFlag(t *testing.T) {
	defer func(v string) { version = v }(version)
	version = "v9.8.7"
	var stdout, stderr strings.Builder
	code := cli([]string{"-version", "-config", filepath.Join(t.TempDir(), "missing.yaml")}, &stdout, &stderr)
	if code != 0 || !strings.HasPrefix(stdout.String(), "idem-gateway v9.8.7 go") || stderr.Len() != 0 {
		t.Errorf("idem-gateway -version: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}
