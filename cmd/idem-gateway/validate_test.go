package main

import (
	"fmt"
	"strings"
	"testing"
)

// lease, ttl and wait are checked at their own line and column, and with
// every other error of the file.
func TestConfigRouteDurations(t *testing.T) {
	for _, c := range []struct {
		name, old, new string
		want           []string
	}{
		{"lease", "    scope: {none: true}\n", "    scope: {none: true}\n    lease: 1ms\n",
			[]string{`g.yaml:14:12: routes[0].lease: 1ms: must be at least 30ms`}},
		{"ttl below lease", "    scope: {none: true}\n", "    scope: {none: true}\n    lease: 1m\n    ttl: 30s\n",
			[]string{`g.yaml:15:10: routes[0].ttl: 30s is shorter than the lease (1m0s)`}},
		{"ttl below the default lease", "    scope: {none: true}\n", "    scope: {none: true}\n    ttl: 10s\n",
			[]string{`g.yaml:14:10: routes[0].ttl: 10s is shorter than the lease (30s)`}},
		{"lease above the default ttl", "    scope: {none: true}\n", "    scope: {none: true}\n    lease: 48h\n",
			[]string{`g.yaml:14:12: routes[0].lease: 48h0m0s is longer than the ttl (24h0m0s)`}},
		{"ttl", "    scope: {none: true}\n", "    scope: {none: true}\n    ttl: 0s\n",
			[]string{`g.yaml:14:10: routes[0].ttl: must be positive`}},
		{"wait", "    scope: {none: true}\n", "    scope: {none: true}\n    wait: -1s\n",
			[]string{`g.yaml:14:11: routes[0].wait: must not be negative`}},
		{"safe method", "    scope: {none: true}\n", "    scope: {none: true}\n    protect: [POST, GET]\n",
			[]string{`g.yaml:14:21: routes[0].protect[1]: "GET" is safe: a safe method needs no protection`}},
		{"key header", "    scope: {none: true}\n", "    scope: {none: true}\n    key: {header: \"Idem Key\"}\n",
			[]string{`g.yaml:14:19: routes[0].key.header: "Idem Key": not a header name`}},
		// A bad lease with an unrelated error elsewhere: both, each at its place.
		{"lease and url", "    scope: {none: true}\n", "    scope: {none: true}\n    lease: 1ms\n",
			[]string{`g.yaml:9:10: upstreams.app.url: "ftp://x": want an absolute http:// or https:// URL`, `g.yaml:14:12: routes[0].lease: 1ms: must be at least 30ms`}},
		{"wait, ttl and a route", "    scope: {none: true}\n", "    scope: {none: true}\n    wait: -1s\n    ttl: 1s\n  - match: GET /x\n    upstream: nope\n    protect: []\n",
			[]string{`g.yaml:14:11: routes[0].wait: must not be negative`, `g.yaml:15:10: routes[0].ttl: 1s is shorter than the lease (30s)`, `g.yaml:17:15: routes[1].upstream: "nope" is not declared in upstreams`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := strings.Replace(base, c.old, c.new, 1)
			if strings.Contains(c.name, "url") {
				src = strings.Replace(src, "http://127.0.0.1:9000", "ftp://x", 1)
			}
			_, err := parseConfig("g.yaml", []byte(src))
			if err == nil {
				t.Fatalf("no error for:\n%s", src)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(c.want) {
				t.Fatalf("got %d errors:\n%v\nwant %d:\n%s\nfile:\n%s", len(lines), err, len(c.want), strings.Join(c.want, "\n"), src)
			}
			for i, w := range c.want {
				if !strings.HasPrefix(lines[i], w) {
					t.Errorf("error %d: got\n%s\nwant\n%s", i, lines[i], w)
				}
			}
		})
	}
}

// Two routes whose patterns match the same requests: one error on one
// line, naming both routes and where they are in the file.
func TestConfigPatternConflict(t *testing.T) {
	for _, c := range []struct{ name, second, want string }{
		{"the same pattern", "POST /orders", `g.yaml:14:12: routes[1].match: "POST /orders" is the pattern of routes[0] too (g.yaml:11:12)`},
		{"the same requests", "POST /orders/{other}", ``},
		{"a conflict", "POST /{a}/x", ``},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := strings.Replace(base, "POST /orders", "POST /orders/{id}", 1)
			if c.want != "" {
				src = base
			}
			src += "  - match: " + c.second + "\n    upstream: app\n    scope: {none: true}\n"
			_, err := parseConfig("g.yaml", []byte(src))
			if err == nil {
				t.Fatalf("no error for:\n%s", src)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") || strings.Contains(msg, ".go:") {
				t.Errorf("not one line, or it names Go source:\n%s", msg)
			}
			want := c.want
			if want == "" {
				want = fmt.Sprintf(`g.yaml:14:12: routes[1].match: %q conflicts with routes[0]'s "POST /orders/{id}" (g.yaml:11:12): `, c.second)
			}
			if !strings.HasPrefix(msg, want) {
				t.Fatalf("got\n%s\nwant it to begin with\n%s", msg, want)
			}
		})
	}
}

// genRoutes returns a valid file with n routes whose patterns end in "/":
// net/http's ServeMux checks each such pattern against every other one.
func genRoutes(n int) []byte {
	var b strings.Builder
	b.WriteString("listen: [{address: \"127.0.0.1:8080\"}]\nstore: {memory: {}}\nupstreams: {app: {url: \"http://127.0.0.1:9000\"}}\nroutes:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {match: \"POST /r%d/\", upstream: app, scope: {none: true}}\n", i)
	}
	return []byte(b.String())
}

// A file of more than 10,000 routes gets one error at routes, and is not
// checked pattern by pattern (which takes a time that grows as the square
// of the routes). 83,000 routes took 12 to 31 s and 0.5 GB to be found
// valid.
func TestConfigTooManyRoutes(t *testing.T) {
	_, err := parseConfig("g.yaml", genRoutes(10_001))
	want := "g.yaml:5:3: routes: 10001 routes: at most 10000"
	if err == nil || !strings.HasPrefix(err.Error(), want) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("got %v, want the one error %q...", err, want)
	}
}

// BenchmarkParseConfigRoutes: the cost of a file of many routes (the
// ServeMux's check of patterns that end in "/" is quadratic).
func BenchmarkParseConfigRoutes(b *testing.B) {
	for _, n := range []int{100, 1000, 10_000} {
		data := genRoutes(n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := parseConfig("g.yaml", data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
