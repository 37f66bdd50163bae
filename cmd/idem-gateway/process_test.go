package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
)

// deadline bounds a test's requests.
func deadline(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// A keyed POST reaches the upstream once and its retry is the same bytes;
// a POST without key and a GET pass through; the admin listener answers.
func TestProcessReplay(t *testing.T) {
	up := newUpstream(t)
	gw := startGateway(t, memoryConfig(up, ""))
	ctx := deadline(t, time.Minute)
	c := &http.Client{}

	first := post(ctx, c, gw.url("/orders"), "k1", `{"item":"book"}`)
	again := settled(ctx, c, gw.url("/orders"), "k1", `{"item":"book"}`)
	if first.status != http.StatusCreated || first.replayed || !again.replayed || again.body != first.body ||
		again.header.Get("X-Execution") != first.header.Get("X-Execution") {
		t.Fatalf("first %v, retry %v: want 201 then the same bytes replayed", first, again)
	}
	if n := up.ran("k1"); n != 1 {
		t.Fatalf("the upstream ran k1 %d times", n)
	}
	if a := post(ctx, c, gw.url("/orders"), "k1", `{"item":"pen"}`); a.status != http.StatusUnprocessableEntity {
		t.Fatalf("the key with another body: %v, want 422", a)
	}
	before := up.executions()
	post(ctx, c, gw.url("/orders"), "", `{}`)
	res, err := c.Get(gw.url("/orders"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if up.executions() != before+2 {
		t.Fatalf("unprotected requests: the upstream ran %d times, want 2", up.executions()-before)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		res, err := c.Get("http://" + gw.admin + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || string(b) != "ok\n" {
			t.Fatalf("%s: %d %q", path, res.StatusCode, b)
		}
	}
	// Prometheus metrics on the admin listener: idemotel's outcomes.
	res, err = c.Get("http://" + gw.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{`idem_requests_total{`, `idem_outcome="replayed"`, `idem_outcome="mismatch"`, `go_goroutines `} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s:\n%s", want, metrics)
		}
	}
	// One log line per outcome, without the key or the body.
	gw.waitLog(t, "request", 10*time.Second, "outcome", "replayed")
	for _, l := range gw.lines() {
		if strings.Contains(l, "k1") || strings.Contains(l, "book") {
			t.Fatalf("the log holds a key or a body: %s", l)
		}
	}
}

// 50 concurrent duplicates: one reaches the upstream, which is held until
// the 49 others have their 409 with Retry-After; then it answers, and a
// retry gets its bytes.
func TestProcessConcurrentDuplicates(t *testing.T) {
	const n = 50
	up := newUpstream(t)
	up.hold()
	gw := startGateway(t, memoryConfig(up, ""))
	ctx := deadline(t, 2*time.Minute)
	c := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: n}}
	answers := make(chan answer, n)
	for range n {
		go func() { answers <- post(ctx, c, gw.url("/pay"), "dup", `{"amount":10}`) }()
	}
	var conflicts int
	for conflicts < n-1 {
		a := receive(t, ctx, answers, "the duplicates' 409s")
		if a.status != http.StatusConflict || a.header.Get("Retry-After") == "" {
			t.Fatalf("a duplicate while the first is in flight: %v (Retry-After %q), want 409 with Retry-After", a, a.header.Get("Retry-After"))
		}
		conflicts++
	}
	up.release()
	first := receive(t, ctx, answers, "the first's answer")
	if first.status != http.StatusCreated || first.replayed {
		t.Fatalf("the first: %v", first)
	}
	if again := settled(ctx, c, gw.url("/pay"), "dup", `{"amount":10}`); !again.replayed || again.body != first.body {
		t.Fatalf("retry: %v, want %v replayed", again, first)
	}
	if r := up.ran("dup"); r != 1 {
		t.Fatalf("the upstream ran %d times", r)
	}
}

// A client that times out while the upstream works, and retries: 409 while
// the upstream still works (its call was not canceled with the client's),
// then the upstream's own response, stored; the upstream ran once.
func TestProcessClientTimesOut(t *testing.T) {
	up := newUpstream(t)
	up.hold()
	up.arrived = make(chan string, 1)
	gw := startGateway(t, memoryConfig(up, ""))
	ctx := deadline(t, time.Minute)
	c := &http.Client{}

	short, cancel := context.WithCancel(ctx)
	gone := make(chan answer, 1)
	go func() { gone <- post(short, c, gw.url("/orders"), "slow", `{}`) }()
	receive(t, ctx, up.arrived, "the request at the upstream")
	cancel() // the client's timeout
	if a := receive(t, ctx, gone, "the answer of the client that gave up"); a.err == nil {
		t.Fatalf("the client that gave up got %v", a)
	}
	if a := post(ctx, c, gw.url("/orders"), "slow", `{}`); a.status != http.StatusConflict || a.header.Get("Retry-After") == "" {
		t.Fatalf("retry while the upstream works: %v, want 409 with Retry-After", a)
	}
	up.release()
	gw.waitLog(t, "request", 30*time.Second, "outcome", "executed")
	a := post(ctx, c, gw.url("/orders"), "slow", `{}`)
	if a.status != http.StatusCreated || !a.replayed || a.header.Get("X-Execution") != "1" {
		t.Fatalf("retry after the upstream answered: %v, want its 201 replayed", a)
	}
	if r := up.ran("slow"); r != 1 {
		t.Fatalf("the upstream ran %d times", r)
	}
}

// A client that leaves mid-body: the upstream never gets the request (the
// gateway reads a protected body whole first), and the retry runs it once.
func TestProcessClientLeavesMidBody(t *testing.T) {
	up := newUpstream(t)
	gw := startGateway(t, memoryConfig(up, ""))
	ctx := deadline(t, time.Minute)
	conn, err := net.Dial("tcp", gw.addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: half\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"item\":")
	conn.Close()
	gw.waitLog(t, "request", 30*time.Second, "outcome", "rejected")
	if r := up.ran("half"); r != 0 {
		t.Fatalf("the upstream got a request whose body never came whole (%d times)", r)
	}
	c := &http.Client{}
	first := post(ctx, c, gw.url("/orders"), "half", `{"item":"book"}`)
	again := settled(ctx, c, gw.url("/orders"), "half", `{"item":"book"}`)
	if first.status != http.StatusCreated || !again.replayed || again.body != first.body || up.ran("half") != 1 {
		t.Fatalf("after the cut: %v then %v, upstream ran %d times", first, again, up.ran("half"))
	}
}

// redisConfig is a gateway of instances instances on the Redis at addr.
func redisConfig(up *upstream, addr, client string, extra string) string {
	return fmt.Sprintf(`instances: 2
listen:
  - address: 127.0.0.1:0
admin:
  address: 127.0.0.1:0
shutdown_grace: 20s
store:
  redis:
    client: %s
    addrs: [%q]
    timeout: 2s
upstreams:
  app:
    url: %s
routes:
  - match: POST /orders
    upstream: app
    scope: {header: X-User}
%s`, client, addr, up.URL, extra)
}

// Two gateways, one on rueidis and one on go-redis, share one Redis:
// duplicates spread over both reach the upstream once per key, and every
// client ends with the same bytes.
func TestProcessTwoGatewaysOneRedis(t *testing.T) {
	const keys, dups = 20, 5
	addr := redistest.Start(t)
	up := newUpstream(t)
	gws := []*proc{
		startGateway(t, redisConfig(up, addr, "rueidis", "")),
		startGateway(t, redisConfig(up, addr, "go-redis", "")),
	}
	ctx := deadline(t, 2*time.Minute)
	c := &http.Client{}
	var mu sync.Mutex
	finals := map[string][]answer{}
	var wg sync.WaitGroup
	for k := range keys {
		for d := range dups {
			wg.Go(func() {
				key := fmt.Sprintf("order-%d", k)
				for {
					a := post(ctx, c, gws[(k+d)%2].url("/orders"), key, `{"n":1}`, "X-User", "alice")
					if a.status == http.StatusConflict && a.err == nil {
						select {
						case <-ctx.Done():
						case <-time.After(20 * time.Millisecond):
							continue
						}
					}
					mu.Lock()
					finals[key] = append(finals[key], a)
					mu.Unlock()
					return
				}
			})
		}
	}
	wg.Wait()
	for k := range keys {
		key := fmt.Sprintf("order-%d", k)
		if r := up.ran(key); r != 1 {
			t.Errorf("%s: the upstream ran %d times", key, r)
		}
		as := finals[key]
		for _, a := range as {
			if a.status != http.StatusCreated || a.body != as[0].body {
				t.Errorf("%s: answers %v", key, as)
				break
			}
		}
	}
	// Another principal's same key is another operation.
	if a := post(ctx, c, gws[0].url("/orders"), "order-0", `{"n":1}`, "X-User", "bob"); a.status != http.StatusCreated || a.replayed {
		t.Fatalf("bob's order-0: %v, want a new execution", a)
	}
	// A protected request without the scope header is refused.
	if a := post(ctx, c, gws[1].url("/orders"), "order-0", `{"n":1}`); a.status != http.StatusUnauthorized ||
		a.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("without X-User: %v, want a 401 problem", a)
	}
}

// SIGTERM while a request is in flight: the gateway stops accepting, lets
// the request finish, stores its record and exits 0; another gateway on
// the same Redis replays it.
func TestProcessSIGTERM(t *testing.T) {
	addr := redistest.Start(t)
	up := newUpstream(t)
	up.hold()
	up.arrived = make(chan string, 1)
	gw := startGateway(t, redisConfig(up, addr, "rueidis", ""))
	ctx := deadline(t, time.Minute)
	c := &http.Client{}
	first := make(chan answer, 1)
	go func() { first <- post(ctx, c, gw.url("/orders"), "term", `{}`, "X-User", "alice") }()
	receive(t, ctx, up.arrived, "the request at the upstream")
	gw.signal(syscall.SIGTERM)
	gw.waitLog(t, "shutting down", 30*time.Second)
	res, err := c.Get("http://" + gw.admin + "/readyz")
	if err == nil {
		res.Body.Close()
		if res.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("/readyz while shutting down: %d", res.StatusCode)
		}
	}
	up.release()
	a := receive(t, ctx, first, "the answer in flight at SIGTERM")
	if a.status != http.StatusCreated {
		t.Fatalf("the request in flight at SIGTERM: %v", a)
	}
	if code := gw.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	other := startGateway(t, redisConfig(up, addr, "go-redis", ""))
	if r := settled(ctx, c, other.url("/orders"), "term", `{}`, "X-User", "alice"); !r.replayed || r.body != a.body {
		t.Fatalf("retry on another gateway: %v, want %v replayed", r, a)
	}
}

// Redis stopped and started again: 503 with Retry-After while it is
// down, /readyz 503, then normal service without restarting the gateway.
func TestProcessRedisRestart(t *testing.T) {
	rp := redistest.StartProc(t)
	up := newUpstream(t)
	gw := startGateway(t, redisConfig(up, rp.Addr(), "rueidis", ""))
	ctx := deadline(t, 2*time.Minute)
	c := &http.Client{}
	if a := post(ctx, c, gw.url("/orders"), "before", `{}`, "X-User", "a"); a.status != http.StatusCreated {
		t.Fatalf("before: %v", a)
	}
	rp.Kill()
	a := post(ctx, c, gw.url("/orders"), "during", `{}`, "X-User", "a")
	if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" {
		t.Fatalf("while Redis is down: %v, want 503 with Retry-After", a)
	}
	if res, err := c.Get("http://" + gw.admin + "/readyz"); err != nil || res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz while Redis is down: %v %v", res, err)
	} else {
		res.Body.Close()
	}
	if up.ran("during") != 0 {
		t.Fatal("the upstream ran while the store was down")
	}
	rp.Restart()
	for {
		a = post(ctx, c, gw.url("/orders"), "during", `{}`, "X-User", "a")
		if a.status != http.StatusServiceUnavailable || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond) // the client's own backoff
	}
	if a.status != http.StatusCreated || up.ran("during") != 1 {
		t.Fatalf("after the restart: %v, upstream ran %d", a, up.ran("during"))
	}
}

// SIGHUP reloads the routes: a new route is served; a file that does not
// load, or that changes the store, is refused and the running routes kept;
// requests sent meanwhile all succeed.
func TestProcessReload(t *testing.T) {
	up1, up2 := newUpstream(t), newUpstream(t)
	gw := startGateway(t, memoryConfig(up1, ""))
	ctx := deadline(t, 2*time.Minute)
	c := &http.Client{}

	// Load on the gateway through every reload.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []answer
	sent := 0
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				a := post(ctx, c, gw.url("/load"), fmt.Sprintf("load-%d-%d", w, i), `{}`)
				mu.Lock()
				sent++
				if a.status != http.StatusCreated {
					bad = append(bad, a)
				}
				mu.Unlock()
			}
		})
	}
	reload := func(config string) {
		t.Helper()
		if err := os.WriteFile(gw.file, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		gw.signal(syscall.SIGHUP)
	}
	two := memoryConfig(up1, "  - match: /v2/\n    upstream: two\n    scope: {none: true}\n")
	two = strings.Replace(two, "upstreams:\n", fmt.Sprintf("upstreams:\n  two:\n    url: %s\n", up2.URL), 1)
	reload(two)
	gw.waitLog(t, "reloaded", 30*time.Second)
	if a := post(ctx, c, gw.url("/v2/orders"), "v2", `{}`); a.status != http.StatusCreated || up2.ran("v2") != 1 {
		t.Fatalf("the new route: %v, its upstream ran %d", a, up2.ran("v2"))
	}
	reload("routes: [\n")
	gw.waitLogs(t, "reload refused: the file does not load; the running configuration is kept", 1, 30*time.Second)
	reload(strings.Replace(two, "memory: {}", "memory: {max_entries: 10}", 1))
	gw.waitLog(t, "reload refused: store changed, which only a restart applies; the running configuration is kept", 30*time.Second)
	if a := post(ctx, c, gw.url("/v2/orders"), "v2b", `{}`); a.status != http.StatusCreated || up2.ran("v2b") != 1 {
		t.Fatalf("after the refused reloads: %v", a)
	}
	// Reload again and again under load.
	for i := range 5 {
		reload(two)
		gw.waitLogs(t, "reloaded", 2+i, 30*time.Second)
	}
	close(stop)
	wg.Wait()
	if len(bad) > 0 || sent == 0 {
		t.Fatalf("%d of %d requests failed across the reloads: %v", len(bad), sent, bad)
	}
}

// An invalid file: the gateway does not start, exits 1 and names the
// file, the line and the field of each error.
func TestProcessInvalidConfig(t *testing.T) {
	file := t.TempDir() + "/bad.yaml"
	os.WriteFile(file, []byte("listen:\n  - address: 127.0.0.1:0\nstore:\n  memory: {}\nupstreams:\n  app: {url: \"ftp://x\"}\nroutes:\n  - match: /\n    upstream: app\n    scope: {none: true}\n    lease: 1\n"), 0o600)
	p := launch(t, file)
	if code := p.wait(t, 30*time.Second); code != 1 {
		t.Fatalf("exit code %d", code)
	}
	out := strings.Join(p.lines(), "\n")
	for _, want := range []string{
		file + `:6:14: upstreams.app.url: "ftp://x": want an absolute http:// or https:// URL`,
		file + `:11:12: routes[0].lease: "1" is not a duration`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stderr lacks %q:\n%s", want, out)
		}
	}
}

// What is not protected passes through untouched: a server-sent event
// stream arrives event by event, and an upgraded connection (WebSocket's
// handshake) carries bytes both ways.
func TestProcessStreams(t *testing.T) {
	next := make(chan struct{})
	up := newUpstream(t)
	up.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/events":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			<-next
			io.WriteString(w, "data: two\n\n")
		case "/ws":
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			brw.Flush()
			line, _ := brw.ReadString('\n')
			brw.WriteString("echo " + line)
			brw.Flush()
		}
	})
	gw := startGateway(t, memoryConfig(up, ""))
	res, err := http.Get(gw.url("/events"))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	if l, err := br.ReadString('\n'); err != nil || l != "data: one\n" {
		t.Fatalf("first event: %q %v", l, err)
	}
	close(next) // the second is sent only once the first arrived
	br.ReadString('\n')
	if l, _ := br.ReadString('\n'); l != "data: two\n" {
		t.Fatalf("second event: %q", l)
	}

	conn, err := net.Dial("tcp", gw.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	cr := bufio.NewReader(conn)
	status, _ := cr.ReadString('\n')
	if !strings.HasPrefix(status, "HTTP/1.1 101") {
		t.Fatalf("upgrade: %q", status)
	}
	for l, _ := cr.ReadString('\n'); l != "\r\n" && l != ""; l, _ = cr.ReadString('\n') {
	}
	io.WriteString(conn, "hello\n")
	if l, _ := cr.ReadString('\n'); l != "echo hello\n" {
		t.Fatalf("over the upgraded connection: %q", l)
	}
}

// The README's gateway, on its example file: a keyed POST /orders runs
// once and is replayed; other routes pass through.
func TestProcessExampleConfig(t *testing.T) {
	src, err := os.ReadFile("gateway.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t)
	config := strings.NewReplacer("127.0.0.1:8080", "127.0.0.1:0", "127.0.0.1:9090", "127.0.0.1:0",
		"http://127.0.0.1:9000", up.URL).Replace(string(src))
	gw := startGateway(t, config)
	ctx := deadline(t, time.Minute)
	c := &http.Client{}
	first := post(ctx, c, gw.url("/orders"), "k1", `{"item":"book"}`)
	again := settled(ctx, c, gw.url("/orders"), "k1", `{"item":"book"}`)
	if first.status != http.StatusCreated || !again.replayed || again.body != first.body || up.ran("k1") != 1 {
		t.Fatalf("%v then %v; the upstream ran %d times", first, again, up.ran("k1"))
	}
	// Another client's (Authorization) k1 is its own.
	if a := post(ctx, c, gw.url("/orders"), "k1", `{"item":"book"}`, "Authorization", "Bearer other"); a.replayed || up.ran("k1") != 2 {
		t.Fatalf("another client's k1: %v", a)
	}
	// "/" protects nothing: a keyed POST elsewhere runs each time.
	post(ctx, c, gw.url("/other"), "k2", `{}`)
	post(ctx, c, gw.url("/other"), "k2", `{}`)
	if up.ran("k2") != 2 {
		t.Fatalf("the pass-through route ran %d times, want 2", up.ran("k2"))
	}
}

// On PostgreSQL: the table is created at start, a retry is replayed, and
// a second gateway on the same table replays it too.
func TestProcessPostgres(t *testing.T) {
	dsn := pgtest.DSN(t)
	up := newUpstream(t)
	config := fmt.Sprintf(`instances: 2
listen: [{address: "127.0.0.1:0"}]
admin: {address: "127.0.0.1:0"}
store:
  postgres: {dsn_env: IDEM_GATEWAY_TEST_DSN, table: gw_%d}
upstreams: {app: {url: %q}}
routes:
  - {match: "POST /orders", upstream: app, scope: {authorization: true}}
`, time.Now().UnixNano(), up.URL)
	env := "IDEM_GATEWAY_TEST_DSN=" + dsn
	a, b := startGateway(t, config, env), startGateway(t, config, env)
	ctx := deadline(t, time.Minute)
	c := &http.Client{}
	first := post(ctx, c, a.url("/orders"), "pg", `{}`)
	again := settled(ctx, c, b.url("/orders"), "pg", `{}`)
	if first.status != http.StatusCreated || !again.replayed || again.body != first.body || up.ran("pg") != 1 {
		t.Fatalf("%v then %v; the upstream ran %d times", first, again, up.ran("pg"))
	}
	res, err := c.Get("http://" + b.admin + "/readyz")
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("/readyz: %v %v", res, err)
	}
	res.Body.Close()
}

// kill -9 of a gateway, with another on the same Redis. Killed after its
// response was stored: the other replays it. Killed while the upstream
// works: the other answers 409 with Retry-After while the dead gateway's
// lease runs, and only then sends the request on, with its Idempotency-Key
// (the documented answer: the dead gateway cannot say whether its call
// went through, and the upstream may dedupe by the key it passes on).
func TestProcessKilled(t *testing.T) {
	const lease = 2 * time.Second
	addr := redistest.Start(t)
	up := newUpstream(t)
	extra := fmt.Sprintf("    lease: %v\n", lease)
	a := startGateway(t, redisConfig(up, addr, "rueidis", extra))
	b := startGateway(t, redisConfig(up, addr, "go-redis", extra))
	ctx := deadline(t, 2*time.Minute)
	c := &http.Client{}

	done := post(ctx, c, a.url("/orders"), "stored", `{}`, "X-User", "u")
	if r := settled(ctx, c, a.url("/orders"), "stored", `{}`, "X-User", "u"); done.status != http.StatusCreated || !r.replayed {
		t.Fatalf("first: %v, then %v", done, r)
	}

	up.hold()
	up.mu.Lock()
	up.arrived = make(chan string, 2)
	up.mu.Unlock()
	lost := make(chan answer, 1)
	go func() { lost <- post(ctx, c, a.url("/orders"), "cut", `{}`, "X-User", "u") }()
	receive(t, ctx, up.arrived, "the request at the upstream")
	a.signal(syscall.SIGKILL)
	killed := time.Now()
	a.wait(t, 30*time.Second)
	if r := receive(t, ctx, lost, "the killed gateway's answer"); r.err == nil {
		t.Fatalf("the killed gateway's client got %v", r)
	}
	up.release() // the upstream finishes its first call, for nobody

	if r := settled(ctx, c, b.url("/orders"), "stored", `{}`, "X-User", "u"); !r.replayed || r.body != done.body {
		t.Fatalf("retry of a stored response after the kill: %v, want %v replayed", r, done)
	}
	var conflicts int
	var r answer
	for {
		r = post(ctx, c, b.url("/orders"), "cut", `{}`, "X-User", "u")
		if r.status != http.StatusConflict || ctx.Err() != nil {
			break
		}
		if r.header.Get("Retry-After") == "" {
			t.Fatalf("409 without Retry-After: %v", r)
		}
		conflicts++
		time.Sleep(50 * time.Millisecond) // the client's own backoff
	}
	after := time.Since(killed)
	if conflicts == 0 || after < lease/2 || r.status != http.StatusCreated || up.ran("cut") != 2 || up.ran("stored") != 1 {
		t.Fatalf("after the kill: %d 409s, then %v after %v; the upstream ran cut %d times and stored %d times; "+
			"want 409 for at least half the lease (%v), then the request sent on once more",
			conflicts, r, after, up.ran("cut"), up.ran("stored"), lease/2)
	}
	t.Logf("lease %v: 409 with Retry-After %d times, for %v after the kill, then sent on", lease, conflicts, after.Round(time.Millisecond))
}

// A client that retries the moment it has its answer finds the stored
// response, not the execution in flight: the gateway holds a small answer
// until its record is stored.
func TestProcessRetryAtOnceReplays(t *testing.T) {
	up := newUpstream(t)
	gw := startGateway(t, memoryConfig(up, ""))
	ctx := deadline(t, time.Minute)
	c := &http.Client{}
	for i := range 300 {
		key := fmt.Sprintf("at-once-%d", i)
		first := post(ctx, c, gw.url("/orders"), key, `{}`)
		again := post(ctx, c, gw.url("/orders"), key, `{}`)
		if first.status != http.StatusCreated || !again.replayed || again.body != first.body {
			t.Fatalf("try %d: %v, then at once %v; want the replay", i, first, again)
		}
	}
}
