package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/storage/memstore"
)

// validate checks what decoding cannot: required fields, exclusive
// choices, ranges, names that must exist, patterns, files that must be
// readable. It reports every error it finds, not just the first.
func validate(d *decoder, c *Config) {
	if c.Instances < 1 {
		d.errorf("instances", "must be at least 1")
	}
	if len(c.Listen) == 0 {
		d.errorf("listen", "declare at least one listener (listen: [{address: \":8080\"}])")
	}
	for i, l := range c.Listen {
		p := fmt.Sprintf("listen[%d]", i)
		checkAddress(d, p+".address", l.Address, true)
		if l.TLS != nil {
			switch {
			case l.TLS.Cert == "" || l.TLS.Key == "":
				d.errorf(p+".tls", "needs both cert and key")
			default:
				if _, err := tls.LoadX509KeyPair(l.TLS.Cert, l.TLS.Key); err != nil {
					d.errorf(p+".tls", "cannot load the key pair: %v", err)
				}
			}
		}
		positive(d, p+".read_header_timeout", l.ReadHeaderTimeout)
		positive(d, p+".idle_timeout", l.IdleTimeout)
	}
	checkAddress(d, "admin.address", c.Admin.Address, false)
	positive(d, "shutdown_grace", c.Shutdown)
	if _, err := logLevel(c.Log.Level); err != nil {
		d.errorf("log.level", "%v", err)
	}
	validateStore(d, c)
	if len(c.Upstreams) == 0 {
		d.errorf("upstreams", "declare at least one upstream (upstreams: {app: {url: \"http://127.0.0.1:9000\"}})")
	}
	for _, name := range sortedKeys(c.Upstreams) {
		validateUpstream(d, "upstreams."+name, c.Upstreams[name])
	}
	if len(c.Routes) == 0 {
		d.errorf("routes", "declare at least one route (routes: [{match: \"/\", upstream: app, scope: {none: true}}])")
	}
	pats := &patterns{mux: http.NewServeMux(), first: map[string]int{}}
	for i, r := range c.Routes {
		validateRoute(d, fmt.Sprintf("routes[%d]", i), r, c, pats)
	}
	if len(d.errs) > 0 {
		return
	}
	// The middleware checks its own options too: the checks above should
	// have found whatever it refuses, and its answer is placed at the route.
	ms := memstore.New()
	defer ms.Close()
	for i, r := range c.Routes {
		if len(r.Protect) == 0 {
			continue
		}
		if _, err := idem.New(ms, routeOptions(r)...); err != nil {
			d.errorf(fmt.Sprintf("routes[%d]", i), "%v", strings.TrimPrefix(err.Error(), "idem: "))
		}
	}
}

// maxRoutes is the most routes a file may declare: net/http's ServeMux
// checks each pattern against those registered before it (one that ends
// in / or {name...} against every one), at each start and reload, a time
// that grows as the square of the routes. The decoder refuses more
// (maxItems), before it decodes them.
const maxRoutes = 10_000

// minLease is the shortest lease idem.WithLease accepts.
const minLease = 30 * time.Millisecond

// patterns checks the routes' patterns as the gateway's ServeMux will
// register them.
type patterns struct {
	mux   *http.ServeMux
	first map[string]int // by pattern, the first route that has it
}

func validateStore(d *decoder, c *Config) {
	s := c.Store
	n := 0
	for _, set := range []bool{s.Memory != nil, s.Redis != nil, s.Postgres != nil, s.DynamoDB != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		d.errorf("store", "declare exactly one of memory, redis, postgres and dynamodb (%d declared)", n)
		return
	}
	switch {
	case s.Memory != nil:
		if c.Instances > 1 {
			d.errorf("store.memory", "keeps the records in one process, and instances is %d: "+
				"each instance would run every request once more; use redis, postgres or dynamodb", c.Instances)
		}
		if s.Memory.MaxEntries < 0 {
			d.errorf("store.memory.max_entries", "must not be negative")
		}
	case s.Redis != nil:
		r := s.Redis
		p := "store.redis"
		if r.Client != "rueidis" && r.Client != "go-redis" {
			d.errorf(p+".client", "%q: want rueidis or go-redis", r.Client)
		}
		if len(r.Addrs) == 0 {
			d.errorf(p+".addrs", "declare at least one host:port")
		}
		for i, a := range r.Addrs {
			checkAddress(d, fmt.Sprintf("%s.addrs[%d]", p, i), a, true)
		}
		if !r.Cluster && r.SentinelMaster == "" && len(r.Addrs) > 1 {
			d.errorf(p+".addrs", "a single server has one address: set cluster: true for Cluster nodes, or sentinel_master for Sentinels")
		}
		if r.Cluster && r.SentinelMaster != "" {
			d.errorf(p, "cluster and sentinel_master exclude each other")
		}
		if r.DB < 0 || (r.Cluster && r.DB != 0) {
			d.errorf(p+".db", "must be 0 or more, and 0 with cluster")
		}
		checkSecret(d, p+".password_file", p+".password_env", r.PasswordFile, r.PasswordEnv, false)
		if r.TLS != nil && r.TLS.CAFile != "" {
			if _, err := loadCAs(r.TLS.CAFile); err != nil {
				d.errorf(p+".tls.ca_file", "%v", err)
			}
		}
		if r.Prefix == "" {
			d.errorf(p+".prefix", "must not be empty")
		}
		positive(d, p+".timeout", r.Timeout)
	case s.Postgres != nil:
		pg := s.Postgres
		p := "store.postgres"
		set := 0
		for _, v := range []string{pg.DSN, pg.DSNFile, pg.DSNEnv} {
			if v != "" {
				set++
			}
		}
		if set != 1 {
			d.errorf(p, "declare exactly one of dsn, dsn_file and dsn_env")
		} else {
			checkSecret(d, p+".dsn_file", p+".dsn_env", pg.DSNFile, pg.DSNEnv, true)
		}
		if pg.Table == "" {
			d.errorf(p+".table", "must not be empty")
		}
		if pg.MaxConns < 0 {
			d.errorf(p+".max_conns", "must not be negative")
		}
		positive(d, p+".timeout", pg.Timeout)
	case s.DynamoDB != nil:
		ddb := s.DynamoDB
		p := "store.dynamodb"
		switch {
		case ddb.Table == "":
			d.errorf(p+".table", "required: the table's name (or ARN)")
		case !validTable(ddb.Table):
			d.errorf(p+".table", "%q: want 3 to 255 letters, digits, _, - and ., or a table's ARN", ddb.Table)
		}
		if ddb.Region != "" && !regionName.MatchString(ddb.Region) {
			d.errorf(p+".region", "%q: want an AWS region such as eu-west-1", ddb.Region)
		}
		if ddb.Endpoint != "" {
			u, err := url.Parse(ddb.Endpoint)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
				d.errorf(p+".endpoint", "%q: want the URL of a DynamoDB API, http://host:port (DynamoDB Local: http://localhost:8000)", ddb.Endpoint)
			}
		}
		positive(d, p+".timeout", ddb.Timeout)
	}
}

func validateUpstream(d *decoder, p string, u *Upstream) {
	if u == nil {
		d.errorf(p, "declare its url")
		return
	}
	t, err := url.Parse(u.URL)
	switch {
	case u.URL == "":
		d.errorf(p+".url", "required")
	case err != nil || (t.Scheme != "http" && t.Scheme != "https") || t.Host == "":
		d.errorf(p+".url", "%q: want an absolute http:// or https:// URL", u.URL)
	case t.RawQuery != "" || t.Fragment != "" || t.User != nil:
		d.errorf(p+".url", "%q: a base URL has no query, fragment or user", u.URL)
	case u.H2C && t.Scheme != "http":
		d.errorf(p+".h2c", "h2c is HTTP/2 without TLS: the url must be http://")
	}
	notNegative(d, p+".timeout", u.Timeout)
	positive(d, p+".dial_timeout", u.DialTimeout)
	notNegative(d, p+".response_header_timeout", u.ResponseHeaderTimeout)
	positive(d, p+".idle_conn_timeout", u.IdleConnTimeout)
	if u.MaxConns < 0 {
		d.errorf(p+".max_conns", "must not be negative")
	}
	if u.MaxIdleConns < 0 {
		d.errorf(p+".max_idle_conns", "must not be negative")
	}
}

func validateRoute(d *decoder, p string, r *Route, c *Config, pats *patterns) {
	if r == nil {
		d.errorf(p, "an empty route")
		return
	}
	if r.Match == "" {
		d.errorf(p+".match", "required: a net/http pattern such as \"POST /orders\" or \"/\"")
	} else if !d.failed(p + ".match") {
		checkPattern(d, p+".match", r.Match, pats)
	}
	if r.Upstream == "" {
		d.errorf(p+".upstream", "required: the name of one of upstreams")
	} else if _, ok := c.Upstreams[r.Upstream]; !ok {
		d.errorf(p+".upstream", "%q is not declared in upstreams (declared: %s)", r.Upstream, strings.Join(sortedKeys(c.Upstreams), ", "))
	}
	for i, m := range r.Protect {
		switch {
		case m == "" || strings.ToUpper(m) != m || strings.ContainsAny(m, " \t/"):
			d.errorf(fmt.Sprintf("%s.protect[%d]", p, i), "%q: want a method in upper case (POST)", m)
		case m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions || m == http.MethodTrace:
			d.errorf(fmt.Sprintf("%s.protect[%d]", p, i), "%q is safe: a safe method needs no protection (POST, PUT, PATCH, DELETE)", m)
		}
	}
	keys := 0
	for _, v := range []string{r.Key.Header, r.Key.JSON, r.Key.Form} {
		if v != "" {
			keys++
		}
	}
	if keys > 1 {
		d.errorf(p+".key", "declare one of header, json and form")
	}
	if r.Key.Header != "" && strings.ContainsAny(r.Key.Header, " \t\r\n:") {
		d.errorf(p+".key.header", "%q: not a header name", r.Key.Header)
	}
	if r.Key.JSON != "" && slices.Contains(strings.Split(r.Key.JSON, "."), "") {
		d.errorf(p+".key.json", "%q: want member names joined by dots (data.object.id)", r.Key.JSON)
	}
	if r.Key.Form != "" && slices.Contains(strings.Split(r.Key.Form, ","), "") {
		d.errorf(p+".key.form", "%q: want field names joined by commas", r.Key.Form)
	}
	switch s := r.Scope; {
	case s == nil && len(r.Protect) == 0: // a plain proxy route has no records
	case s == nil:
		d.errorf(p+".scope", "required: header (set by the authentication proxy in front), jwt, authorization, or none")
	default:
		n := 0
		for _, set := range []bool{s.Header != "", s.Authorization, s.None, s.JWT != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			d.errorf(p+".scope", "declare exactly one of header, authorization, jwt and none: true")
		}
		if s.JWT != nil {
			for _, pr := range checkJWT(s.JWT) {
				field := p + ".scope.jwt"
				if pr.Field != "" {
					field += "." + pr.Field
				}
				d.errorf(field, "%s", pr.Msg)
			}
		}
	}
	// lease, ttl and wait, as idem.New checks them, each at its own field.
	leaseOK := r.Lease >= minLease && !d.failed(p+".lease")
	ttlOK := r.TTL > 0 && !d.failed(p+".ttl")
	if !leaseOK {
		d.errorf(p+".lease", "%v: must be at least %v", r.Lease, minLease)
	}
	if !ttlOK {
		d.errorf(p+".ttl", "must be positive")
	}
	if leaseOK && ttlOK && r.TTL < r.Lease {
		if _, written := d.pos[p+".ttl"]; written {
			d.errorf(p+".ttl", "%v is shorter than the lease (%v): a response is kept at least as long as its key is held", r.TTL, r.Lease)
		} else {
			d.errorf(p+".lease", "%v is longer than the ttl (%v): a response is kept at least as long as its key is held", r.Lease, r.TTL)
		}
	}
	notNegative(d, p+".wait", r.Wait)
	for i, s := range r.Cacheable {
		if _, _, err := statusRange(s); err != nil {
			d.errorf(fmt.Sprintf("%s.cacheable[%d]", p, i), "%v", err)
		}
	}
	if r.MaxRequestBody <= 0 {
		d.errorf(p+".max_request_body", "must be positive")
	}
	if r.MaxResponseBody <= 0 {
		d.errorf(p+".max_response_body", "must be positive")
	}
}

// checkPattern checks the route's pattern at path: that net/http parses
// it, and that no route before matches the same requests (the ServeMux
// refuses two such patterns).
func checkPattern(d *decoder, path, pattern string, pats *patterns) {
	if j, ok := pats.first[pattern]; ok {
		d.errorf(path, "%q is the pattern of routes[%d] too (%s)", pattern, j, d.where(fmt.Sprintf("routes[%d].match", j)))
		return
	}
	err := register(pats.mux, pattern, http.NotFoundHandler())
	if err == nil {
		pats.first[pattern] = routeIndex(path)
		return
	}
	// "pattern P (registered at F:L) conflicts with pattern Q (registered
	// at F:L):\nwhy, on lines": Q and why make the error, on one line.
	msg := err.Error()
	if _, rest, ok := strings.Cut(msg, " conflicts with pattern "); ok {
		if q, err := strconv.QuotedPrefix(rest); err == nil {
			other, _ := strconv.Unquote(q)
			if j, ok := pats.first[other]; ok {
				_, why, _ := strings.Cut(rest, ":\n")
				d.errorf(path, "%q conflicts with routes[%d]'s %q (%s): %s", pattern, j, other, d.where(fmt.Sprintf("routes[%d].match", j)), oneLine(why))
				return
			}
		}
	}
	d.errorf(path, "%s", oneLine(msg))
}

// where names the place in the file of the field at path: "g.yaml:3:12".
func (d *decoder) where(path string) string {
	if n, ok := d.pos[path]; ok {
		return fmt.Sprintf("%s:%d:%d", d.file, n.Line, n.Column)
	}
	return d.file
}

// routeIndex returns i of "routes[i].match".
func routeIndex(path string) int {
	s := strings.TrimPrefix(path, "routes[")
	s, _, _ = strings.Cut(s, "]")
	i, _ := strconv.Atoi(s)
	return i
}

// registeredAt is what net/http's ServeMux says of where a pattern was
// registered: a place in the gateway's source, not in the file.
var registeredAt = regexp.MustCompile(` \(registered at [^)]*\)`)

// oneLine makes a ServeMux error one line, without its source places.
func oneLine(s string) string {
	s = registeredAt.ReplaceAllString(s, "")
	return strings.Join(strings.Fields(s), " ")
}

// register adds pattern to mux, turning its panic on a malformed or
// conflicting pattern into an error.
func register(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%v", v)
		}
	}()
	mux.Handle(pattern, h)
	return nil
}

// statusRange parses "201" or "200-299".
func statusRange(s string) (lo, hi int, err error) {
	a, b, isRange := strings.Cut(s, "-")
	lo, err1 := strconv.Atoi(strings.TrimSpace(a))
	hi, err2 := lo, error(nil)
	if isRange {
		hi, err2 = strconv.Atoi(strings.TrimSpace(b))
	}
	if err1 != nil || err2 != nil || lo < 100 || hi > 599 || lo > hi {
		return 0, 0, fmt.Errorf("%q: want a status (201) or a range (200-299) between 100 and 599", s)
	}
	return lo, hi, nil
}

func checkAddress(d *decoder, p, addr string, required bool) {
	if addr == "" {
		if required {
			d.errorf(p, "required: host:port")
		}
		return
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || !validPort(port) {
		d.errorf(p, "%q: want host:port (\":8080\", \"127.0.0.1:9090\")", addr)
	}
}

// checkSecret checks a secret given by file or environment variable: at
// most one of the two (exactly one when required), a readable file, a set
// variable.
func checkSecret(d *decoder, filePath, envPath, file, env string, required bool) {
	switch {
	case file != "" && env != "":
		d.errorf(envPath, "exclusive with %s", filePath[strings.LastIndex(filePath, ".")+1:])
	case file != "":
		if _, err := readSecretFile(file); err != nil {
			d.errorf(filePath, "%v", err)
		}
	case env != "":
		if os.Getenv(env) == "" {
			d.errorf(envPath, "the environment variable %s is not set, or empty", env)
		}
	}
}

// readSecretFile reads a secret, without its trailing newline.
func readSecretFile(name string) (string, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return "", err
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%s is empty", name)
	}
	return s, nil
}

func loadCAs(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}

func positive(d *decoder, p string, v time.Duration) {
	if v <= 0 {
		d.errorf(p, "must be positive")
	}
}

func notNegative(d *decoder, p string, v time.Duration) {
	if v < 0 {
		d.errorf(p, "must not be negative")
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// validPort reports whether port is a port number (0: any free port).
func validPort(port string) bool {
	n, err := strconv.Atoi(port)
	return err == nil && n >= 0 && n <= 65535
}
